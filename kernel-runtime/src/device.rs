//! Where a tensor lives: host memory or one CUDA device.

use std::fmt;
use std::str::FromStr;

/// A compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory and the CPU reference ops (f32 compute).
    Cpu,
    /// CUDA device by ordinal.
    Cuda(usize),
}

impl Device {
    /// The `device` field of a `msgl_tensor`: the CUDA ordinal, or -1 for the host.
    pub fn abi_code(self) -> i32 {
        match self {
            Device::Cpu => -1,
            Device::Cuda(i) => i as i32,
        }
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Device, String> {
        match s.trim() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device `{other}` (expected cpu, cuda or cuda:N)")),
        }
    }
}
