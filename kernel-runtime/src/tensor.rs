//! [`Tensor`]: a strided view of host or CUDA memory, and its C ABI mirror.
//!
//! A tensor is cheap to clone: clones and views ([`Tensor::narrow`],
//! [`Tensor::reshape`]) share one reference-counted buffer. Memory is a plain
//! allocation the kernels write through, the way a device pointer is: ops that
//! write take the output tensor as an argument and document it; the engine runs
//! the ops of one device from one thread at a time, which is what keeps writes and
//! reads of a buffer ordered (on CUDA the single compute stream orders them too).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;

use crate::cuda::{self, CudaDevice};
use crate::device::Device;
use crate::dtype::{DType, Element, FloatElement};
use crate::error::{Error, Result};
use crate::sys::kernels::{msgl_tensor, MSGL_MAX_DIMS};

/// Host allocations are aligned for 64-byte vector loads.
const HOST_ALIGN: usize = 64;

/// Host memory owned by a tensor buffer.
pub(crate) struct HostBuffer {
    ptr: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the buffer is plain memory with no thread affinity; concurrent access is
// governed by the ordering rule in the module docs.
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    fn zeroed(bytes: usize) -> Result<HostBuffer> {
        if bytes == 0 {
            return Ok(HostBuffer { ptr: NonNull::<u64>::dangling().cast(), bytes: 0 });
        }
        let layout = Layout::from_size_align(bytes, HOST_ALIGN)
            .map_err(|_| Error::arg("alloc", format!("{bytes} bytes is too large a host allocation")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::arg("alloc", format!("out of host memory allocating {bytes} bytes")))?;
        Ok(HostBuffer { ptr, bytes })
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.bytes != 0 {
            // SAFETY: allocated in `zeroed` with this exact layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.bytes, HOST_ALIGN)) }
        }
    }
}

/// Device memory owned by a tensor buffer, returned to the device's caching
/// allocator on drop.
pub(crate) struct DeviceBuffer {
    ptr: CUdeviceptr,
    size: usize,
    device: Arc<CudaDevice>,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.device.free(self.ptr, self.size);
    }
}

/// The memory behind a tensor.
pub(crate) enum Buffer {
    Host(HostBuffer),
    Device(DeviceBuffer),
}

impl Buffer {
    fn device(&self) -> Device {
        match self {
            Buffer::Host(_) => Device::Cpu,
            Buffer::Device(d) => Device::Cuda(d.device.ordinal()),
        }
    }
}

/// An n-dimensional strided array on the host or a CUDA device.
#[derive(Clone)]
pub struct Tensor {
    buffer: Arc<Buffer>,
    /// Offset of element [0, 0, ...] in elements from the start of the buffer.
    offset: usize,
    shape: Vec<usize>,
    /// Strides in elements.
    strides: Vec<usize>,
    dtype: DType,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {}, {})", self.shape, self.dtype, self.device())
    }
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

fn numel_of(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::arg("tensor", format!("shape {shape:?} has too many elements")))
}

impl Tensor {
    /// A new tensor; host memory is zeroed, device memory is uninitialised.
    pub fn empty(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        if shape.len() > MSGL_MAX_DIMS as usize {
            return Err(Error::arg(
                "tensor",
                format!("{} dimensions exceed the maximum of {MSGL_MAX_DIMS}", shape.len()),
            ));
        }
        let bytes = numel_of(shape)?
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::arg("tensor", format!("shape {shape:?} is too large")))?;
        let buffer = match device {
            Device::Cpu => Buffer::Host(HostBuffer::zeroed(bytes)?),
            Device::Cuda(i) => {
                let dev = cuda::device(i)?;
                let (ptr, size) = dev.alloc(bytes)?;
                Buffer::Device(DeviceBuffer { ptr, size, device: dev })
            }
        };
        Ok(Tensor {
            buffer: Arc::new(buffer),
            offset: 0,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            dtype,
        })
    }

    /// A new tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        if let Buffer::Device(d) = t.buffer.as_ref() {
            d.device.memset(d.ptr, 0, t.numel() * dtype.size_in_bytes())?;
        }
        Ok(t)
    }

    /// Sets every element of this contiguous tensor (or view) to zero bits,
    /// enqueued on the device's stream without waiting (a plain write on the host).
    pub fn fill_zero(&self) -> Result<()> {
        self.expect_contiguous("fill_zero", "tensor")?;
        let bytes = self.size_in_bytes();
        match self.buffer.as_ref() {
            Buffer::Device(d) => d.device.memset(self.device_ptr(), 0, bytes),
            // SAFETY: the contiguous span of this view lies inside the host buffer;
            // no other slice of it is live (ops' ordering rule).
            Buffer::Host(_) => unsafe {
                std::ptr::write_bytes(self.host_ptr(), 0, bytes);
                Ok(())
            },
        }
    }

    /// A tensor holding a copy of `data` (row-major) with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::from_bytes(bytemuck::cast_slice(data), T::DTYPE, shape, device)
    }

    /// A tensor holding a copy of raw little-endian element bytes.
    pub fn from_bytes(bytes: &[u8], dtype: DType, shape: &[usize], device: Device) -> Result<Tensor> {
        let n = numel_of(shape)?;
        if bytes.len() != n * dtype.size_in_bytes() {
            return Err(Error::arg(
                "from_bytes",
                format!(
                    "{} bytes do not hold a {dtype} tensor of shape {shape:?} ({} bytes)",
                    bytes.len(),
                    n * dtype.size_in_bytes()
                ),
            ));
        }
        let t = Tensor::empty(shape, dtype, device)?;
        match t.buffer.as_ref() {
            Buffer::Host(h) => {
                // SAFETY: the fresh buffer holds exactly bytes.len() bytes and is not
                // shared yet.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), h.ptr.as_ptr(), bytes.len()) }
            }
            Buffer::Device(d) => d.device.copy_htod(d.ptr, bytes)?,
        }
        Ok(t)
    }

    /// Writes `data`, a row-major `[rows, cols]` block, into the leading `rows`
    /// rows and `cols` columns of this contiguous 2-D tensor (a 1-D tensor is one
    /// row), in place: one copy, and on CUDA one 2-D copy whatever the number of
    /// rows, which waits for the stream. The buffer keeps its address, which is
    /// what CUDA graphs need of their inputs.
    pub fn write_rows<T: Element>(&self, data: &[T], cols: usize) -> Result<()> {
        const OP: &str = "write_rows";
        self.check_write_rows::<T>(OP, data.len(), cols)?;
        if data.is_empty() {
            return Ok(());
        }
        let rows = data.len() / cols;
        let width = self.write_rows_width();
        let elem = self.dtype.size_in_bytes();
        let bytes: &[u8] = bytemuck::cast_slice(data);
        match self.buffer.as_ref() {
            Buffer::Host(_) => {
                for r in 0..rows {
                    // SAFETY: row r's first `cols` elements lie inside this contiguous
                    // tensor (checked above); `bytes` holds rows * cols elements.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr().add(r * cols * elem),
                            self.host_ptr().add(r * width * elem),
                            cols * elem,
                        )
                    }
                }
                Ok(())
            }
            Buffer::Device(d) => d.device.copy_htod_2d(self.device_ptr(), width * elem, bytes, cols * elem, rows),
        }
    }

    /// Checks that `len` values of `T` in rows of `cols` fit the leading rows and
    /// columns of this contiguous tensor of rank 1 or 2 ([`Self::write_rows`]).
    pub(crate) fn check_write_rows<T: Element>(&self, op: &'static str, len: usize, cols: usize) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::arg(op, format!("tensor has dtype {}, data is {}", self.dtype, T::DTYPE)));
        }
        if !self.is_contiguous() || self.rank() > 2 {
            return Err(Error::arg(
                op,
                format!("needs a contiguous tensor of rank 1 or 2, got shape {:?}", self.shape),
            ));
        }
        let (num_rows, width) = match self.shape[..] {
            [w] => (1, w),
            [r, w] => (r, w),
            _ => (1, 1),
        };
        let rows = len.checked_div(cols).unwrap_or(0);
        if cols > width || rows > num_rows || rows * cols != len {
            return Err(Error::arg(
                op,
                format!("{len} values in rows of {cols} do not fit a tensor of shape {:?}", self.shape),
            ));
        }
        Ok(())
    }

    /// Elements per row of a tensor of rank 1 or 2, as [`Self::write_rows`] sees it.
    pub(crate) fn write_rows_width(&self) -> usize {
        match self.shape[..] {
            [w] | [_, w] => w,
            _ => 1,
        }
    }

    /// A 1-D i32 tensor of `len` values `start, start + 1, ...`.
    pub fn arange_i32(start: i32, len: usize, device: Device) -> Result<Tensor> {
        let v: Vec<i32> = (0..len as i32).map(|i| start + i).collect();
        Tensor::from_slice(&v, &[len], device)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Size of dimension `d`.
    pub fn dim(&self, d: usize) -> usize {
        self.shape.get(d).copied().unwrap_or(1)
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.buffer.device()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes covered by the elements (numel x element size).
    pub fn size_in_bytes(&self) -> usize {
        self.numel() * self.dtype.size_in_bytes()
    }

    /// Whether the elements are laid out row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (d, s) in self.shape.iter().zip(&self.strides).rev() {
            if *d != 1 && *s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// The shape as an array, or an error naming `what` when the rank differs.
    pub fn dims<const N: usize>(&self, op: &'static str, what: &str) -> Result<[usize; N]> {
        <[usize; N]>::try_from(self.shape.as_slice()).map_err(|_| {
            Error::arg(op, format!("argument `{what}` must have {N} dimensions, got shape {:?}", self.shape))
        })
    }

    /// Checks the dtype, naming the argument in the error.
    pub fn expect_dtype(&self, op: &'static str, what: &str, allowed: &[DType]) -> Result<&Tensor> {
        if allowed.contains(&self.dtype) {
            Ok(self)
        } else {
            let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
            Err(Error::arg(op, format!("argument `{what}` has dtype {}, expected {}", self.dtype, names.join("|"))))
        }
    }

    /// Checks the shape, naming the argument in the error.
    pub fn expect_shape(&self, op: &'static str, what: &str, shape: &[usize]) -> Result<&Tensor> {
        if self.shape == shape {
            Ok(self)
        } else {
            Err(Error::arg(op, format!("argument `{what}` has shape {:?}, expected {shape:?}", self.shape)))
        }
    }

    /// Checks the device, naming the argument in the error.
    pub fn expect_device(&self, op: &'static str, what: &str, device: Device) -> Result<&Tensor> {
        if self.device() == device {
            Ok(self)
        } else {
            Err(Error::arg(op, format!("argument `{what}` is on {}, expected {device}", self.device())))
        }
    }

    /// Checks that the tensor is contiguous, naming the argument in the error.
    pub fn expect_contiguous(&self, op: &'static str, what: &str) -> Result<&Tensor> {
        if self.is_contiguous() {
            Ok(self)
        } else {
            Err(Error::arg(
                op,
                format!("argument `{what}` must be contiguous (shape {:?}, strides {:?})", self.shape, self.strides),
            ))
        }
    }

    /// A view of `len` entries of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let size = *self
            .shape
            .get(dim)
            .ok_or_else(|| Error::arg("narrow", format!("dimension {dim} out of range for shape {:?}", self.shape)))?;
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::arg(
                "narrow",
                format!(
                    "range {start}..{} out of bounds for dimension {dim} of size {size}",
                    start.saturating_add(len)
                ),
            ));
        }
        let mut t = self.clone();
        if len > 0 {
            t.offset += start * self.strides[dim];
        }
        t.shape[dim] = len;
        Ok(t)
    }

    /// The same elements with another shape (the tensor must be contiguous).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel_of(shape)? != self.numel() {
            return Err(Error::arg("reshape", format!("cannot reshape {:?} into {shape:?}", self.shape)));
        }
        if !self.is_contiguous() {
            return Err(Error::arg(
                "reshape",
                format!("shape {:?} with strides {:?} is not contiguous", self.shape, self.strides),
            ));
        }
        if shape.len() > MSGL_MAX_DIMS as usize {
            return Err(Error::arg(
                "reshape",
                format!("{} dimensions exceed the maximum of {MSGL_MAX_DIMS}", shape.len()),
            ));
        }
        Ok(Tensor { shape: shape.to_vec(), strides: contiguous_strides(shape), ..self.clone() })
    }

    /// A view whose dimensions are permuted (no copy).
    pub fn permute(&self, order: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        if order.len() != self.rank()
            || order.iter().any(|&o| o >= self.rank() || std::mem::replace(&mut seen[o], true))
        {
            return Err(Error::arg("permute", format!("{order:?} is not a permutation of {} dimensions", self.rank())));
        }
        Ok(Tensor {
            shape: order.iter().map(|&o| self.shape[o]).collect(),
            strides: order.iter().map(|&o| self.strides[o]).collect(),
            ..self.clone()
        })
    }

    /// Copies to `device` (a clone when it is already there).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let bytes = self.to_host_bytes()?;
        Tensor::from_bytes(&bytes, self.dtype, &self.shape, device)
    }

    /// The elements as raw row-major bytes on the host.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let t = self.contiguous()?;
        let n = t.size_in_bytes();
        let mut out = vec![0u8; n];
        match t.buffer.as_ref() {
            Buffer::Host(_) => {
                // SAFETY: a contiguous tensor covers n bytes from its start pointer,
                // inside its buffer.
                unsafe { std::ptr::copy_nonoverlapping(t.host_ptr(), out.as_mut_ptr(), n) }
            }
            Buffer::Device(d) => d.device.copy_dtoh(&mut out, t.device_ptr())?,
        }
        Ok(out)
    }

    /// The elements as a row-major `Vec<T>` on the host; `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::arg("to_vec", format!("tensor has dtype {}, asked for {}", self.dtype, T::DTYPE)));
        }
        let bytes = self.to_host_bytes()?;
        let mut out = vec![T::zeroed(); self.numel()];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }

    /// Float elements converted to f32 on the host (integers are converted too).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        Ok(match self.dtype {
            DType::F32 => self.to_vec::<f32>()?,
            DType::F16 => self.to_vec::<half::f16>()?.into_iter().map(FloatElement::to_f32).collect(),
            DType::BF16 => self.to_vec::<half::bf16>()?.into_iter().map(FloatElement::to_f32).collect(),
            DType::I32 => self.to_vec::<i32>()?.into_iter().map(|v| v as f32).collect(),
            DType::I64 => self.to_vec::<i64>()?.into_iter().map(|v| v as f32).collect(),
            DType::U8 => self.to_vec::<u8>()?.into_iter().map(f32::from).collect(),
        })
    }

    /// Whether two tensors share memory (same buffer).
    pub fn same_buffer(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.buffer, &other.buffer)
    }

    // ---- crate-internal access to memory -------------------------------------

    /// Element offset of [0, ...] from the start of the buffer.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// The device handle of a CUDA tensor.
    pub(crate) fn cuda_device(&self) -> Option<&Arc<CudaDevice>> {
        match self.buffer.as_ref() {
            Buffer::Device(d) => Some(&d.device),
            Buffer::Host(_) => None,
        }
    }

    /// Address of element [0, ...] of a CUDA tensor (0 for a host tensor).
    pub(crate) fn device_ptr(&self) -> CUdeviceptr {
        match self.buffer.as_ref() {
            Buffer::Device(d) => d.ptr + (self.offset * self.dtype.size_in_bytes()) as CUdeviceptr,
            Buffer::Host(_) => 0,
        }
    }

    /// Address of element [0, ...] of a host tensor (dangling for a device tensor).
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        match self.buffer.as_ref() {
            // SAFETY: offset is inside the allocation (views are bounds-checked).
            Buffer::Host(h) => unsafe { h.ptr.as_ptr().add(self.offset * self.dtype.size_in_bytes()) },
            Buffer::Device(_) => NonNull::<u64>::dangling().cast().as_ptr(),
        }
    }

    /// The elements of a host tensor from [0, ...] to the end of its storage span,
    /// as `T`. For a contiguous tensor this is exactly its elements.
    ///
    /// # Safety
    /// No other thread may write the span while the slice lives (module docs).
    pub(crate) unsafe fn host_slice<T: Element>(&self) -> Result<&[T]> {
        let (ptr, len) = self.host_span::<T>()?;
        Ok(std::slice::from_raw_parts(ptr, len))
    }

    /// Mutable counterpart of [`Tensor::host_slice`].
    ///
    /// # Safety
    /// No other live slice may overlap the span while this one lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn host_slice_mut<T: Element>(&self) -> Result<&mut [T]> {
        let (ptr, len) = self.host_span::<T>()?;
        Ok(std::slice::from_raw_parts_mut(ptr, len))
    }

    fn host_span<T: Element>(&self) -> Result<(*mut T, usize)> {
        if T::DTYPE.size_in_bytes() != self.dtype.size_in_bytes() {
            return Err(Error::arg("host_slice", format!("tensor has dtype {}, read as {}", self.dtype, T::DTYPE)));
        }
        let Buffer::Host(h) = self.buffer.as_ref() else {
            return Err(Error::arg("host_slice", format!("tensor is on {}, expected the host", self.device())));
        };
        if self.numel() == 0 {
            return Ok((NonNull::<T>::dangling().as_ptr(), 0));
        }
        let span = self.shape.iter().zip(&self.strides).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
        let total = h.bytes / self.dtype.size_in_bytes();
        if self.offset + span > total {
            return Err(Error::arg("host_slice", "view exceeds its buffer"));
        }
        Ok((self.host_ptr().cast::<T>(), span))
    }

    /// The C ABI view passed to launchers.
    pub(crate) fn abi(&self) -> msgl_tensor {
        let mut t = msgl_tensor {
            data: match self.buffer.as_ref() {
                Buffer::Device(_) => self.device_ptr() as *mut std::ffi::c_void,
                Buffer::Host(_) => self.host_ptr().cast(),
            },
            dtype: self.dtype.abi_code(),
            ndim: self.shape.len() as i32,
            device: self.device().abi_code(),
            ..Default::default()
        };
        for (i, (d, s)) in self.shape.iter().zip(&self.strides).enumerate() {
            t.shape[i] = *d as i64;
            t.strides[i] = *s as i64;
        }
        t
    }

    /// A copy of this view's metadata with other strides/shape/offset: for ops and
    /// tests that need to build non-contiguous views of the same buffer.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        if shape.len() != strides.len() || shape.len() > MSGL_MAX_DIMS as usize {
            return Err(Error::arg("as_strided", format!("shape {shape:?} and strides {strides:?} differ in rank")));
        }
        let total = match self.buffer.as_ref() {
            Buffer::Host(h) => h.bytes / self.dtype.size_in_bytes(),
            Buffer::Device(d) => d.size / self.dtype.size_in_bytes(),
        };
        let span =
            if shape.contains(&0) { 0 } else { shape.iter().zip(strides).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1 };
        if offset + span > total {
            return Err(Error::arg(
                "as_strided",
                format!("view of shape {shape:?} strides {strides:?} at {offset} exceeds the buffer"),
            ));
        }
        Ok(Tensor {
            buffer: self.buffer.clone(),
            offset,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            dtype: self.dtype,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_share_memory_and_check_bounds() {
        let t = Tensor::from_slice(&(0..24).map(|i| i as f32).collect::<Vec<_>>(), &[2, 3, 4], Device::Cpu).unwrap();
        let row = t.narrow(1, 1, 2).unwrap();
        assert_eq!(row.shape(), [2, 2, 4]);
        assert!(!row.is_contiguous());
        assert_eq!(row.to_vec::<f32>().unwrap()[..4], [4.0, 5.0, 6.0, 7.0]);
        assert!(t.narrow(1, 2, 2).is_err());
        assert!(t.narrow(3, 0, 1).is_err());
        let r = t.reshape(&[6, 4]).unwrap();
        assert!(r.same_buffer(&t));
        assert!(row.reshape(&[16]).is_err());
        let p = t.permute(&[2, 0, 1]).unwrap();
        assert_eq!(p.shape(), [4, 2, 3]);
        assert_eq!(p.contiguous().unwrap().to_vec::<f32>().unwrap()[..3], [0.0, 4.0, 8.0]);
        assert!(t.to_vec::<i32>().is_err());
        assert!(Tensor::from_slice(&[1.0f32; 5], &[2, 3], Device::Cpu).is_err());
    }

    #[test]
    fn abi_view_mirrors_shape_and_strides() {
        let t = Tensor::zeros(&[4, 8], DType::BF16, Device::Cpu).unwrap();
        let v = t.narrow(1, 2, 4).unwrap().abi();
        assert_eq!((v.ndim, v.dtype, v.device), (2, DType::BF16.abi_code(), -1));
        assert_eq!(&v.shape[..2], &[4, 4]);
        assert_eq!(&v.strides[..2], &[8, 1]);
        assert_eq!(v.data as usize - t.host_ptr() as usize, 4);
    }
}
