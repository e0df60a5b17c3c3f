//! The control channel's framing: length-prefixed, versioned messages with a
//! bound on every size, and the little encoder and decoder their bodies use.
//!
//! A frame is `magic u32 | version u16 | kind u8 | length u32 | body`. Reading
//! checks the magic, the version and the length (at most [`MAX_FRAME_BYTES`])
//! before allocating, and the decoder checks every count against the bytes
//! left, so a bad or hostile peer costs an error, never a panic or an
//! unbounded allocation. Tensors never travel here (the collectives move
//! them); what does is a step's host layout and sampling settings.

use std::io::{ErrorKind, Read, Write};

/// "MSCC": minisgl control channel.
const MAGIC: u32 = 0x4d53_4343;
/// Bumped whenever a message changes; peers of another version are refused.
pub const PROTOCOL_VERSION: u16 = 2;
/// The largest body accepted (a step of 256 requests of 8K new tokens is ~10 MB).
pub const MAX_FRAME_BYTES: usize = 256 << 20;

/// What went wrong on the channel.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("timed out")]
    TimedOut,
    #[error("{0}")]
    Io(std::io::Error),
    #[error("malformed message: {0}")]
    Malformed(String),
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted => WireError::Closed,
            ErrorKind::WouldBlock | ErrorKind::TimedOut => WireError::TimedOut,
            _ => WireError::Io(e),
        }
    }
}

/// Writes one frame.
pub fn write_frame(mut w: impl Write, kind: u8, body: &[u8]) -> Result<(), WireError> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(WireError::Malformed(format!("a body of {} bytes exceeds {MAX_FRAME_BYTES}", body.len())));
    }
    let mut header = Vec::with_capacity(11 + body.len());
    header.extend_from_slice(&MAGIC.to_le_bytes());
    header.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    header.push(kind);
    header.extend_from_slice(&(body.len() as u32).to_le_bytes());
    header.extend_from_slice(body);
    w.write_all(&header)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame: its kind and body.
pub fn read_frame(mut r: impl Read) -> Result<(u8, Vec<u8>), WireError> {
    let mut header = [0u8; 11];
    r.read_exact(&mut header)?;
    let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if magic != MAGIC {
        return Err(WireError::Malformed("not a minisgl control message (bad magic)".into()));
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(WireError::Malformed(format!(
            "protocol version {version}, this process speaks {PROTOCOL_VERSION} (mixed minisgl builds?)"
        )));
    }
    let kind = header[6];
    let len = u32::from_le_bytes([header[7], header[8], header[9], header[10]]) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(WireError::Malformed(format!("a body of {len} bytes exceeds {MAX_FRAME_BYTES}")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok((kind, body))
}

/// Builds a message body.
#[derive(Default)]
pub struct Enc(Vec<u8>);

impl Enc {
    pub fn new() -> Enc {
        Enc(Vec::new())
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            Some(v) => self.u8(1).u64(v),
            None => self.u8(0),
        }
    }

    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }

    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }

    pub fn u32s(&mut self, v: &[u32]) -> &mut Self {
        self.u32(v.len() as u32);
        for &x in v {
            self.u32(x);
        }
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// Reads a message body, every read checked against what is left.
pub struct Dec<'a> {
    body: &'a [u8],
}

impl<'a> Dec<'a> {
    pub fn new(body: &'a [u8]) -> Dec<'a> {
        Dec { body }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        if n > self.body.len() {
            return Err(WireError::Malformed(format!("{what}: {n} bytes wanted, {} left", self.body.len())));
        }
        let (head, rest) = self.body.split_at(n);
        self.body = rest;
        Ok(head)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, WireError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    pub fn usize(&mut self, what: &str) -> Result<usize, WireError> {
        usize::try_from(self.u64(what)?).map_err(|_| WireError::Malformed(format!("{what} does not fit usize")))
    }

    pub fn f32(&mut self, what: &str) -> Result<f32, WireError> {
        Ok(f32::from_bits(self.u32(what)?))
    }

    pub fn opt_u64(&mut self, what: &str) -> Result<Option<u64>, WireError> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.u64(what)?)),
            t => Err(WireError::Malformed(format!("{what}: option tag {t}"))),
        }
    }

    pub fn bytes(&mut self, what: &str) -> Result<Vec<u8>, WireError> {
        let n = self.u32(what)? as usize;
        Ok(self.take(n, what)?.to_vec())
    }

    pub fn str(&mut self, what: &str) -> Result<String, WireError> {
        String::from_utf8(self.bytes(what)?).map_err(|_| WireError::Malformed(format!("{what} is not UTF-8")))
    }

    pub fn u32s(&mut self, what: &str) -> Result<Vec<u32>, WireError> {
        let n = self.u32(what)? as usize;
        let raw = self.take(n.saturating_mul(4), what)?;
        Ok(raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    /// Fails unless the whole body was read (a longer message is a bug or a peer
    /// of another build).
    pub fn end(&self, what: &str) -> Result<(), WireError> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed(format!("{what}: {} bytes left over", self.body.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let mut buf = Vec::new();
        let body = Enc::new().u32(7).str("hi").u32s(&[1, 2, 3]).opt_u64(None).f32(0.5).finish();
        write_frame(&mut buf, 3, &body).unwrap();
        let (kind, got) = read_frame(&buf[..]).unwrap();
        assert_eq!(kind, 3);
        let mut d = Dec::new(&got);
        assert_eq!(d.u32("a").unwrap(), 7);
        assert_eq!(d.str("b").unwrap(), "hi");
        assert_eq!(d.u32s("c").unwrap(), [1, 2, 3]);
        assert_eq!(d.opt_u64("d").unwrap(), None);
        assert_eq!(d.f32("e").unwrap(), 0.5);
        d.end("msg").unwrap();

        // A length beyond the bound is refused before anything is allocated.
        let mut huge = buf.clone();
        huge[7..11].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read_frame(&huge[..]), Err(WireError::Malformed(m)) if m.contains("exceeds")));
        // Another version is refused.
        let mut other = buf.clone();
        other[4] = 99;
        assert!(matches!(read_frame(&other[..]), Err(WireError::Malformed(m)) if m.contains("version")));
        // A truncated frame is a closed connection.
        assert!(matches!(read_frame(&buf[..5]), Err(WireError::Closed)));
        // A count larger than the body is an error, not an allocation.
        let lying = Enc::new().u32(1 << 30).finish();
        assert!(Dec::new(&lying).u32s("ids").is_err());
    }
}
