//! Weight loading: checkpoint tensors by HF name, converted to the compute dtype,
//! fused where the layers want them fused, and placed on a device.
//!
//! Three sources stand behind one [`Weights`] handle:
//!
//! | source | what |
//! | --- | --- |
//! | safetensors | an HF folder: `model.safetensors`, or shards listed by `model.safetensors.index.json` |
//! | GGUF | a llama.cpp file, through [`GgufCheckpoint`] (dequantised to f32, HF names) |
//! | dummy | random weights of the shapes the model asks for (`--load-format dummy`) |
//!
//! Models ask through a [`VarBuilder`] (candle's name for it): a prefix plus the
//! checkpoint name, so a model's `vb.pp("self_attn")` reads like the checkpoint.
//! The only renaming is fusing, listed once in [`MERGE_GROUPS`] (mini-sglang's
//! `_MERGE_GROUPS`): the attention block holds one `qkv_proj` and the MLP one
//! `gate_up_proj`, concatenated along the output dimension in the table's order
//! (q, k, v; gate then up, as `ops::silu_mul` expects).
//!
//! Under tensor parallelism ([`Weights::with_tp`]) the layers ask for their
//! rank's [`Slice`] of a tensor: a safetensors slice is read from the file as
//! it lies (one positioned read per contiguous run of it; [`Weights::bytes_read`]
//! counts what was read), a GGUF slice of rows is dequantised alone (a slice of
//! columns from the whole tensor, whose quantised blocks run along the rows),
//! and dummy values are made for the whole tensor
//! on the device and cut there, so that a shard holds exactly the values of the
//! unsplit model.
//!
//! NOTE: safetensors files are read with positioned reads of each tensor's bytes,
//! not memory-mapped as DESIGN.md has it: this crate forbids `unsafe`, and mapping
//! a file is unsafe. When kernel-runtime grows a safe mmap helper, only
//! [`SafetensorsFile::read`] changes. Either way a host copy is made per tensor
//! (to convert dtypes and to fuse) before the upload.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use kernel_runtime::{DType, Device, Tensor};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype as StDtype;

use crate::error::{ModelError, Result};
use crate::gguf::GgufCheckpoint;
use crate::tp::TpGroup;

/// Tensors the layers hold fused: the fused name and, in order, the checkpoint
/// tensors concatenated (along dimension 0) to make it. Names are the last path
/// component before `.weight` / `.bias`.
pub const MERGE_GROUPS: &[MergeGroup] = &[
    MergeGroup { fused: "qkv_proj", parts: &["q_proj", "k_proj", "v_proj"] },
    MergeGroup { fused: "gate_up_proj", parts: &["gate_proj", "up_proj"] },
];

/// One row of [`MERGE_GROUPS`].
#[derive(Debug, Clone, Copy)]
pub struct MergeGroup {
    /// The name the layer uses (`qkv_proj`).
    pub fused: &'static str,
    /// The checkpoint names it is made of, in concatenation order.
    pub parts: &'static [&'static str],
}

/// The part of a checkpoint tensor a rank loads: `len` entries from `start`
/// along dimension `dim` (every entry of the other dimensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub dim: usize,
    pub start: usize,
    pub len: usize,
}

impl Slice {
    /// The entries `range` of dimension `dim`.
    pub fn of(dim: usize, range: Range<usize>) -> Slice {
        Slice { dim, start: range.start, len: range.len() }
    }

    /// The local shape of a tensor of `full` shape, or why the slice does not fit it.
    fn shape(&self, full: &[usize]) -> std::result::Result<Vec<usize>, String> {
        match full.get(self.dim) {
            Some(&n) if self.start.checked_add(self.len).is_some_and(|end| end <= n) => {
                let mut shape = full.to_vec();
                shape[self.dim] = self.len;
                Ok(shape)
            }
            _ => Err(format!(
                "slice {}..{} of dimension {} does not fit shape {full:?}",
                self.start,
                self.start + self.len,
                self.dim
            )),
        }
    }
}

/// Where weights come from (`--load-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadFormat {
    /// Safetensors for a folder, the file itself for a `.gguf`.
    Auto,
    /// Safetensors in an HF folder.
    Safetensors,
    /// Random weights from `config.json` alone (benchmarks at real sizes).
    Dummy,
}

impl FromStr for LoadFormat {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<LoadFormat, String> {
        match s.trim() {
            "auto" => Ok(LoadFormat::Auto),
            "safetensors" => Ok(LoadFormat::Safetensors),
            "dummy" => Ok(LoadFormat::Dummy),
            other => Err(format!("unknown load format `{other}` (expected auto, safetensors or dummy)")),
        }
    }
}

// ---- safetensors -----------------------------------------------------------------

/// Headers above this size are rejected as corrupt (the safetensors crate's limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One safetensors file: its parsed header and where the tensor data starts.
#[derive(Debug)]
struct SafetensorsFile {
    path: PathBuf,
    data_start: u64,
    tensors: HashMap<String, TensorInfo>,
}

impl SafetensorsFile {
    /// Reads and validates the header: a length, a JSON table whose offsets tile the
    /// data without gaps (checked by the safetensors crate), and a file exactly as
    /// long as the table says (so a truncated download is caught here, not when a
    /// tensor is read).
    fn open(path: &Path) -> Result<SafetensorsFile> {
        let bad = |message: String| ModelError::Safetensors { path: path.to_path_buf(), message };
        let mut file = File::open(path).map_err(ModelError::io(path))?;
        let file_len = file.metadata().map_err(ModelError::io(path))?.len();
        let mut len_bytes = [0u8; 8];
        if file_len < 8 {
            return Err(bad(format!("the file has {file_len} bytes, fewer than the 8-byte header length (truncated)")));
        }
        file.read_exact(&mut len_bytes).map_err(ModelError::io(path))?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER_BYTES {
            return Err(bad(format!("header length {header_len} is implausibly large (corrupt file)")));
        }
        if 8 + header_len > file_len {
            return Err(bad(format!(
                "header length {header_len} exceeds the {file_len}-byte file (truncated or corrupt)"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header).map_err(ModelError::io(path))?;
        let metadata: Metadata = serde_json::from_slice(&header).map_err(|e| bad(format!("corrupt header: {e}")))?;
        let data_start = 8 + header_len;
        let data_len = metadata.data_len() as u64;
        let have = file_len - data_start;
        if have < data_len {
            return Err(bad(format!(
                "truncated: the header describes {data_len} bytes of tensor data, the file holds {have}"
            )));
        }
        if have > data_len {
            return Err(bad(format!(
                "{} bytes of trailing data after the {data_len} bytes the header describes (corrupt)",
                have - data_len
            )));
        }
        let tensors = metadata.tensors().into_iter().map(|(name, info)| (name, info.clone())).collect();
        Ok(SafetensorsFile { path: path.to_path_buf(), data_start, tensors })
    }

    /// The raw bytes of one tensor of this file (elements of `elem` bytes), all
    /// of it or its `slice` (checked to fit by the caller): one positioned read
    /// per contiguous run, adding the bytes read to `counter`.
    fn read_slice(&self, info: &TensorInfo, elem: usize, slice: Option<Slice>, counter: &AtomicU64) -> Result<Vec<u8>> {
        let base = self.data_start + info.data_offsets.0 as u64;
        // (runs, bytes per run, bytes between runs, offset of the first run)
        let (runs, chunk, stride, first) = match slice {
            None => (1, info.data_offsets.1 - info.data_offsets.0, 0, 0),
            Some(s) => {
                let shape = &info.shape;
                let inner: usize = shape[s.dim + 1..].iter().product::<usize>() * elem;
                (shape[..s.dim].iter().product(), s.len * inner, shape[s.dim] * inner, s.start * inner)
            }
        };
        let file = File::open(&self.path).map_err(ModelError::io(&self.path))?;
        let mut bytes = vec![0u8; runs * chunk];
        if chunk > 0 {
            for (run, out) in bytes.chunks_exact_mut(chunk).enumerate() {
                let at = base + (run * stride + first) as u64;
                file.read_exact_at(out, at).map_err(ModelError::io(&self.path))?;
            }
        }
        counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }
}

/// The safetensors files of an HF folder and which file holds which tensor.
#[derive(Debug)]
struct SafetensorsFolder {
    files: Vec<SafetensorsFile>,
    index: HashMap<String, usize>,
}

/// The single-file and the sharded layouts' file names.
const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// Whether `dir` holds safetensors weights in one of the two layouts.
pub fn has_safetensors(dir: &Path) -> bool {
    dir.join(INDEX_FILE).is_file() || dir.join(SINGLE_FILE).is_file()
}

impl SafetensorsFolder {
    fn open(dir: &Path) -> Result<SafetensorsFolder> {
        let index_path = dir.join(INDEX_FILE);
        let (names, weight_map): (Vec<String>, Option<HashMap<String, String>>) = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(ModelError::io(&index_path))?;
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| ModelError::Json { path: index_path.clone(), source })?;
            let map = value.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| ModelError::Safetensors {
                path: index_path.clone(),
                message: "no `weight_map` object".into(),
            })?;
            let mut weight_map = HashMap::new();
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| ModelError::Safetensors {
                    path: index_path.clone(),
                    message: format!("`weight_map.{tensor}` is not a file name"),
                })?;
                // Shards live in the model folder: a name with a directory
                // part (`../x`, `/etc/x`, `sub/x`) could read any file.
                let mut parts = Path::new(file).components();
                if !matches!((parts.next(), parts.next()), (Some(std::path::Component::Normal(_)), None)) {
                    return Err(ModelError::Safetensors {
                        path: index_path.clone(),
                        message: format!("`weight_map.{tensor}` = {file:?} is not a file name in the model folder"),
                    });
                }
                weight_map.insert(tensor.clone(), file.to_owned());
            }
            let files: BTreeSet<String> = weight_map.values().cloned().collect();
            (files.into_iter().collect(), Some(weight_map))
        } else if dir.join(SINGLE_FILE).is_file() {
            (vec![SINGLE_FILE.to_owned()], None)
        } else {
            return Err(ModelError::NoWeights {
                path: dir.to_path_buf(),
                message: format!("no {SINGLE_FILE} or {INDEX_FILE} (use --load-format dummy for random weights)"),
            });
        };

        let mut files = Vec::with_capacity(names.len());
        let mut index = HashMap::new();
        for name in &names {
            let file = SafetensorsFile::open(&dir.join(name))?;
            for tensor in file.tensors.keys() {
                index.insert(tensor.clone(), files.len());
            }
            files.push(file);
        }
        if let Some(weight_map) = weight_map {
            for (tensor, file) in &weight_map {
                let holds =
                    index.get(tensor).is_some_and(|&i| files[i].path.file_name().is_some_and(|f| f == file.as_str()));
                if !holds {
                    return Err(ModelError::Safetensors {
                        path: index_path.clone(),
                        message: format!("`weight_map` puts tensor `{tensor}` in {file}, which does not hold it"),
                    });
                }
            }
        }
        Ok(SafetensorsFolder { files, index })
    }

    fn lookup(&self, name: &str) -> Option<(&SafetensorsFile, &TensorInfo)> {
        let file = &self.files[*self.index.get(name)?];
        Some((file, file.tensors.get(name)?))
    }
}

// ---- dummy weights -------------------------------------------------------------

/// FNV-1a: a stable hash of tensor names for per-tensor seeds.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Fills `out` (tensor `name`, contiguous, on any device) with deterministic
/// random values in ranges that keep activations finite at any depth: norm
/// weights near 1, biases small, matrices uniform with variance `1 / fan_in`
/// (fan_in = the last dimension), which is what keeps `x @ w^T` at the scale of
/// `x`. The values are `ops::fill_uniform`'s, a counter-based function of the
/// seed, the name and the element index: the same on the CPU and on a GPU,
/// where they are made in place (a 30B-parameter model in well under a second).
fn fill_dummy(out: &Tensor, seed: u64, name: &str) -> Result<()> {
    let fan_in = out.shape().last().copied().unwrap_or(1).max(1) as f32;
    let (center, half_width) = if name.ends_with("norm.weight") {
        (1.0, 0.1)
    } else if name.ends_with(".bias") {
        (0.0, 0.02)
    } else {
        (0.0, (3.0 / fan_in).sqrt())
    };
    Ok(kernel_runtime::ops::fill_uniform(out, seed ^ fnv1a(name.as_bytes()), center, half_width)?)
}

// ---- the weights handle --------------------------------------------------------

#[derive(Debug)]
enum Source {
    Safetensors(SafetensorsFolder),
    Gguf(Box<GgufCheckpoint>),
    Dummy { seed: u64 },
}

/// A checkpoint opened for loading into `dtype` on `device`.
#[derive(Debug)]
pub struct Weights {
    source: Source,
    /// The folder or file named in errors.
    location: PathBuf,
    dtype: DType,
    device: Device,
    /// The rank the layers load for (and the collectives they keep).
    tp: TpGroup,
    /// Bytes read from safetensors files so far.
    bytes_read: AtomicU64,
}

impl Weights {
    /// The safetensors weights of an HF folder.
    pub fn safetensors(dir: &Path, dtype: DType, device: Device) -> Result<Weights> {
        Ok(Weights::new(Source::Safetensors(SafetensorsFolder::open(dir)?), dir, dtype, device))
    }

    /// The tensors of a GGUF checkpoint (dequantised to f32, then converted).
    pub fn gguf(checkpoint: GgufCheckpoint, path: &Path, dtype: DType, device: Device) -> Result<Weights> {
        Ok(Weights::new(Source::Gguf(Box::new(checkpoint)), path, dtype, device))
    }

    /// Random weights (see `dummy_values`), the same for the same `seed` and names.
    pub fn dummy(location: &Path, seed: u64, dtype: DType, device: Device) -> Weights {
        Weights::new(Source::Dummy { seed }, location, dtype, device)
    }

    fn new(source: Source, location: &Path, dtype: DType, device: Device) -> Weights {
        Weights {
            source,
            location: location.to_path_buf(),
            dtype,
            device,
            tp: TpGroup::single(),
            bytes_read: AtomicU64::new(0),
        }
    }

    /// The same checkpoint, loaded as rank `tp.shard()` (each layer takes its
    /// slice and keeps the group's collectives).
    pub fn with_tp(mut self, tp: TpGroup) -> Weights {
        self.tp = tp;
        self
    }

    /// The tensor-parallel group the layers load for.
    pub fn tp(&self) -> &TpGroup {
        &self.tp
    }

    /// Bytes read from safetensors files so far (what sharded loading saves).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// The compute dtype tensors are converted to.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device tensors are placed on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A builder at the checkpoint's root.
    pub fn root(&self) -> VarBuilder<'_> {
        VarBuilder { weights: self, prefix: String::new() }
    }

    /// Whether the checkpoint has a tensor of this full name (dummy weights have
    /// every tensor the model asks for, but no pre-fused ones).
    fn has(&self, name: &str) -> bool {
        match &self.source {
            Source::Safetensors(f) => f.index.contains_key(name),
            Source::Gguf(g) => g.tensor(name).is_some(),
            Source::Dummy { .. } => false,
        }
    }

    fn shape_error(&self, name: &str, expected: &[usize], actual: &[usize]) -> ModelError {
        ModelError::TensorShape {
            location: self.location.clone(),
            name: name.to_owned(),
            expected: expected.to_vec(),
            actual: actual.to_vec(),
        }
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::MissingTensor { location: self.location.clone(), name: name.to_owned() }
    }

    fn slice_error(&self, name: &str, message: String) -> ModelError {
        ModelError::Unsupported { path: self.location.clone(), message: format!("tensor `{name}`: {message}") }
    }

    /// Tensor `name`, checked against `shape`, as a host tensor in the compute
    /// dtype: all of it, or its `slice` (then of the slice's shape).
    fn load_host(&self, name: &str, shape: &[usize], slice: Option<Slice>) -> Result<Tensor> {
        let local = match slice {
            Some(s) => s.shape(shape).map_err(|m| self.slice_error(name, m))?,
            None => shape.to_vec(),
        };
        let host = match &self.source {
            Source::Safetensors(folder) => {
                let (file, info) = folder.lookup(name).ok_or_else(|| self.missing(name))?;
                if info.shape != shape {
                    return Err(self.shape_error(name, shape, &info.shape));
                }
                let dtype = match info.dtype {
                    StDtype::BF16 => DType::BF16,
                    StDtype::F16 => DType::F16,
                    StDtype::F32 => DType::F32,
                    other => {
                        return Err(ModelError::TensorDtype {
                            location: file.path.clone(),
                            name: name.to_owned(),
                            stored: format!("{other:?}"),
                        })
                    }
                };
                let bytes = file.read_slice(info, dtype.size_in_bytes(), slice, &self.bytes_read)?;
                Tensor::from_bytes(&bytes, dtype, &local, Device::Cpu)?
            }
            Source::Gguf(checkpoint) => {
                let info = checkpoint.tensor(name).ok_or_else(|| self.missing(name))?;
                if info.shape != shape {
                    return Err(self.shape_error(name, shape, &info.shape));
                }
                // A slice of rows is dequantised alone; other slices (columns) from
                // the whole tensor, whose quantised blocks run along the rows.
                let rows = match slice {
                    Some(s) if s.dim == 0 => checkpoint.load_f32_rows(name, s.start..s.start + s.len)?,
                    _ => None,
                };
                match (rows, slice) {
                    (Some(data), _) => Tensor::from_slice(&data, &local, Device::Cpu)?,
                    (None, Some(s)) => {
                        let (_, data) = checkpoint.load_f32(name)?;
                        Tensor::from_slice(&data, shape, Device::Cpu)?.narrow(s.dim, s.start, s.len)?.contiguous()?
                    }
                    (None, None) => Tensor::from_slice(&checkpoint.load_f32(name)?.1, shape, Device::Cpu)?,
                }
            }
            Source::Dummy { seed } => {
                let host = Tensor::empty(shape, self.dtype, Device::Cpu)?;
                fill_dummy(&host, *seed, name)?;
                match slice {
                    Some(s) => host.narrow(s.dim, s.start, s.len)?.contiguous()?,
                    None => host,
                }
            }
        };
        Ok(host.to_dtype(self.dtype)?)
    }
}

/// A view of [`Weights`] under a name prefix (`model.layers.3.`).
#[derive(Debug, Clone)]
pub struct VarBuilder<'a> {
    weights: &'a Weights,
    prefix: String,
}

impl<'a> VarBuilder<'a> {
    /// The builder for the sub-module `name` (`vb.pp("self_attn")`).
    pub fn pp(&self, name: impl AsRef<str>) -> VarBuilder<'a> {
        VarBuilder { weights: self.weights, prefix: self.name(name.as_ref()) }
    }

    /// The full checkpoint name of `leaf` under this prefix.
    pub fn name(&self, leaf: &str) -> String {
        if self.prefix.is_empty() {
            leaf.to_owned()
        } else {
            format!("{}.{leaf}", self.prefix)
        }
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.weights.dtype
    }

    /// The target device.
    pub fn device(&self) -> Device {
        self.weights.device
    }

    /// The tensor-parallel group the layers load for.
    pub fn tp(&self) -> &'a TpGroup {
        &self.weights.tp
    }

    /// An error about this checkpoint that is not any one tensor's (a size that
    /// does not split over the ranks).
    pub fn unsupported(&self, message: impl Into<String>) -> ModelError {
        ModelError::Unsupported { path: self.weights.location.clone(), message: message.into() }
    }

    /// This rank's equal part of `n` things called `what`.
    pub fn split(&self, n: usize, what: &str) -> Result<Range<usize>> {
        self.weights.tp.shard().split(n, what).map_err(|m| self.unsupported(m))
    }

    /// Tensor `leaf` of exactly `shape`, in the compute dtype, on the device.
    pub fn get(&self, leaf: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_slice(leaf, shape, None)
    }

    /// `slice` of tensor `leaf` of `shape` (all of it for `None`), in the
    /// compute dtype, on the device.
    pub fn get_slice(&self, leaf: &str, shape: &[usize], slice: Option<Slice>) -> Result<Tensor> {
        if let Source::Dummy { seed } = self.weights.source {
            // Made where it is used: no host generation, no upload. A slice is cut
            // from the whole tensor, so that shards hold the unsplit model's values.
            let t = Tensor::empty(shape, self.weights.dtype, self.weights.device)?;
            fill_dummy(&t, seed, &self.name(leaf))?;
            return match slice {
                Some(s) => {
                    s.shape(shape).map_err(|m| self.weights.slice_error(&self.name(leaf), m))?;
                    Ok(t.narrow(s.dim, s.start, s.len)?.contiguous()?)
                }
                None => Ok(t),
            };
        }
        Ok(self.weights.load_host(&self.name(leaf), shape, slice)?.to_device(self.weights.device)?)
    }

    /// The fused tensor `fused.suffix` (`qkv_proj.weight`): the checkpoint's own
    /// fused tensor when it has one, else the parts [`MERGE_GROUPS`] lists for
    /// `fused`, of shapes `[rows_i, rest...]`, concatenated along dimension 0.
    pub fn get_merged(&self, fused: &str, suffix: &str, part_rows: &[usize], rest: &[usize]) -> Result<Tensor> {
        let parts: Vec<(usize, Range<usize>)> = part_rows.iter().map(|&r| (r, 0..r)).collect();
        self.get_merged_slices(fused, suffix, &parts, rest)
    }

    /// [`Self::get_merged`] for one rank: of part `i`, which has `parts[i].0`
    /// rows, only the rows `parts[i].1`, the parts' rows concatenated.
    pub fn get_merged_slices(
        &self,
        fused: &str,
        suffix: &str,
        parts: &[(usize, Range<usize>)],
        rest: &[usize],
    ) -> Result<Tensor> {
        let group = MERGE_GROUPS.iter().find(|g| g.fused == fused).ok_or_else(|| ModelError::MissingTensor {
            location: self.weights.location.clone(),
            name: format!("{} (no merge group `{fused}`)", self.name(fused)),
        })?;
        if group.parts.len() != parts.len() {
            return Err(ModelError::MissingTensor {
                location: self.weights.location.clone(),
                name: format!(
                    "{} (merge group `{fused}` has {} parts, {} sizes given)",
                    self.name(fused),
                    group.parts.len(),
                    parts.len()
                ),
            });
        }
        let shape_of = |rows: usize| -> Vec<usize> { std::iter::once(rows).chain(rest.iter().copied()).collect() };
        let local_rows: usize = parts.iter().map(|(_, r)| r.len()).sum();
        let shape = shape_of(local_rows);
        let fused_leaf = format!("{fused}.{suffix}");
        let pieces: Vec<Tensor> = if self.weights.has(&self.name(&fused_leaf)) {
            // The checkpoint's fused tensor: each part's rows at the part's offset.
            let full = shape_of(parts.iter().map(|(rows, _)| rows).sum());
            let mut offset = 0;
            let mut pieces = Vec::with_capacity(parts.len());
            for (rows, range) in parts {
                let slice = Slice::of(0, offset + range.start..offset + range.end);
                pieces.push(self.get_slice(&fused_leaf, &full, Some(slice))?);
                offset += rows;
            }
            pieces
        } else {
            // The parts, each its own tensor (dummy values: each as if loaded alone).
            group
                .parts
                .iter()
                .zip(parts)
                .map(|(part, (rows, range))| {
                    let slice = (range.len() != *rows).then(|| Slice::of(0, range.clone()));
                    self.get_slice(&format!("{part}.{suffix}"), &shape_of(*rows), slice)
                })
                .collect::<Result<_>>()?
        };
        if let [only] = &pieces[..] {
            return Ok(only.clone());
        }
        let t = Tensor::empty(&shape, self.weights.dtype, self.weights.device)?;
        let mut row = 0;
        for piece in &pieces {
            let rows = piece.dim(0);
            kernel_runtime::ops::copy(&t.narrow(0, row, rows)?, piece)?;
            row += rows;
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_weights_are_deterministic_and_scaled() {
        let fill = |name: &str, shape: &[usize]| {
            let t = Tensor::empty(shape, DType::F32, Device::Cpu).unwrap();
            fill_dummy(&t, 7, name).unwrap();
            t.to_vec::<f32>().unwrap()
        };
        let a = fill("model.layers.0.mlp.down_proj.weight", &[64, 1024]);
        assert_eq!(a, fill("model.layers.0.mlp.down_proj.weight", &[64, 1024]));
        assert_ne!(a, fill("model.layers.1.mlp.down_proj.weight", &[64, 1024]));
        let var = a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32;
        assert!((var * 1024.0 - 1.0).abs() < 0.05, "variance {var}");
        let norm = fill("model.norm.weight", &[64]);
        assert!(norm.iter().all(|v| (0.9..1.1).contains(v)));
    }

    #[test]
    fn dummy_merged_parts_equal_the_parts_made_alone() {
        let dir = Path::new("/nonexistent");
        let w = Weights::dummy(dir, 3, DType::BF16, Device::Cpu);
        let vb = w.root().pp("model.layers.0.self_attn");
        let fused = vb.get_merged("qkv_proj", "weight", &[64, 32, 32], &[48]).unwrap();
        let q = vb.get("q_proj.weight", &[64, 48]).unwrap();
        let v = vb.get("v_proj.weight", &[32, 48]).unwrap();
        assert_eq!(
            fused.narrow(0, 0, 64).unwrap().contiguous().unwrap().to_host_bytes().unwrap(),
            q.to_host_bytes().unwrap()
        );
        assert_eq!(
            fused.narrow(0, 96, 32).unwrap().contiguous().unwrap().to_host_bytes().unwrap(),
            v.to_host_bytes().unwrap()
        );
    }

    #[test]
    fn load_formats_parse() {
        assert_eq!("dummy".parse::<LoadFormat>(), Ok(LoadFormat::Dummy));
        assert!("pt".parse::<LoadFormat>().unwrap_err().contains("auto, safetensors or dummy"));
    }
}
