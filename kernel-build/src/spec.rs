//! `csrc/kernels.toml`: the one declaration of every kernel family.
//!
//! Both the ahead-of-time build (nvcc) and the runtime (NVRTC, manifest checks)
//! read the file through [`Spec`], so a family, its launcher symbols and its
//! template instances are written down exactly once.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

/// The `format` key this version of kernel-build reads.
pub const SPEC_FORMAT: u32 = 1;

/// The parsed `kernels.toml`.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Every kernel family, in file order.
    pub families: Vec<Family>,
}

/// One kernel family: one `.cu` file with its launchers and instances.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Family {
    /// Short name (`store`), also the name the runtime resolves instances by.
    pub name: String,
    /// The source file, relative to `csrc/`.
    pub source: String,
    /// `extern "C"` host launchers exported by the shared library.
    #[serde(default)]
    pub symbols: Vec<String>,
    /// `extern "C" __global__` entry of one instance, for families that compile
    /// to cubins and through NVRTC.
    #[serde(default)]
    pub jit_entry: Option<String>,
    /// Template parameters of an instance, in order.
    #[serde(default)]
    pub params: Vec<String>,
    /// Values of each parameter built ahead of time (cartesian product).
    #[serde(default)]
    pub instances: BTreeMap<String, Vec<i64>>,
    /// More groups of instances, each a cartesian product like `instances`: for
    /// values that only make sense together (a tile used at one head dim), so that
    /// the build does not compile the whole product.
    #[serde(default)]
    pub extra_instances: Vec<BTreeMap<String, Vec<i64>>>,
}

/// One specialisation of a family: a value for each parameter, in `params` order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Instance {
    values: Vec<(String, i64)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    format: u32,
    #[serde(default, rename = "family")]
    families: Vec<Family>,
}

impl Spec {
    /// Reads and validates `csrc/kernels.toml` under `csrc_dir`.
    pub fn load(csrc_dir: &Path) -> Result<Spec> {
        let path = csrc_dir.join("kernels.toml");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        Spec::parse(&text, &path)
    }

    /// Parses the text of a `kernels.toml` (`path` is only used in messages).
    pub fn parse(text: &str, path: &Path) -> Result<Spec> {
        let raw: RawSpec =
            toml::from_str(text).map_err(|e| Error::Spec { path: path.to_owned(), message: e.to_string() })?;
        if raw.format != SPEC_FORMAT {
            return Err(Error::Spec {
                path: path.to_owned(),
                message: format!("format {} is not supported (this build reads format {SPEC_FORMAT})", raw.format),
            });
        }
        let spec = Spec { families: raw.families };
        spec.validate().map_err(|message| Error::Spec { path: path.to_owned(), message })?;
        Ok(spec)
    }

    /// The family called `name`.
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// Every source file, relative to `csrc/`, in family order.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.families.iter().map(|f| f.source.as_str())
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        let mut symbols = std::collections::BTreeSet::new();
        for f in &self.families {
            if f.name.is_empty() || !f.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("family name `{}` must be non-empty ASCII letters, digits or `_`", f.name));
            }
            if !names.insert(f.name.as_str()) {
                return Err(format!("family `{}` is declared twice", f.name));
            }
            if !f.source.ends_with(".cu") || f.source.contains("..") || f.source.starts_with('/') {
                return Err(format!("family `{}`: source `{}` must be a .cu path inside csrc/", f.name, f.source));
            }
            for s in f.symbols.iter().chain(f.jit_entry.iter()) {
                if !s.starts_with("msgl_") {
                    return Err(format!("family `{}`: symbol `{s}` must start with `msgl_`", f.name));
                }
                if !symbols.insert(s.as_str()) {
                    return Err(format!("family `{}`: symbol `{s}` is declared twice", f.name));
                }
            }
            let declared: std::collections::BTreeSet<&str> = f.params.iter().map(String::as_str).collect();
            for group in f.instance_groups() {
                let given: std::collections::BTreeSet<&str> = group.keys().map(String::as_str).collect();
                if declared != given {
                    return Err(format!(
                        "family `{}`: params {:?} and the keys of instances {:?} differ",
                        f.name, f.params, given
                    ));
                }
                if group.values().any(Vec::is_empty) {
                    return Err(format!("family `{}`: every parameter needs at least one instance value", f.name));
                }
            }
            if f.params.iter().any(|p| !p.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')) {
                return Err(format!("family `{}`: params must be UPPER_SNAKE_CASE, got {:?}", f.name, f.params));
            }
            if !f.params.is_empty() && f.jit_entry.is_none() && f.symbols.is_empty() {
                return Err(format!("family `{}` has instances but neither symbols nor a jit_entry", f.name));
            }
        }
        Ok(())
    }
}

impl Family {
    /// `instances` and then each of `extra_instances`.
    fn instance_groups(&self) -> impl Iterator<Item = &BTreeMap<String, Vec<i64>>> {
        std::iter::once(&self.instances).chain(&self.extra_instances)
    }

    /// Every instance built ahead of time: the cartesian product of the parameter
    /// values, first parameter outermost, then those of each extra group not already
    /// listed.
    pub fn instances(&self) -> Vec<Instance> {
        if self.params.is_empty() {
            return Vec::new();
        }
        let mut all: Vec<Instance> = Vec::new();
        for group in self.instance_groups() {
            let mut out = vec![Instance { values: Vec::new() }];
            for p in &self.params {
                let values = group.get(p).map(Vec::as_slice).unwrap_or(&[]);
                out = out
                    .into_iter()
                    .flat_map(|inst| {
                        values.iter().map(move |v| {
                            let mut next = inst.clone();
                            next.values.push((p.clone(), *v));
                            next
                        })
                    })
                    .collect();
            }
            for inst in out {
                if !all.contains(&inst) {
                    all.push(inst);
                }
            }
        }
        all
    }

    /// Builds the instance of this family with the given parameter values, checking
    /// that they name exactly this family's parameters.
    pub fn instance(&self, values: &[(&str, i64)]) -> Result<Instance> {
        let names: Vec<&str> = values.iter().map(|(n, _)| *n).collect();
        let expected: Vec<&str> = self.params.iter().map(String::as_str).collect();
        if names != expected {
            return Err(Error::Instance {
                family: self.name.clone(),
                message: format!("expected parameters {expected:?}, got {names:?}"),
            });
        }
        Ok(Instance { values: values.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect() })
    }

    /// Whether `instance` is one of the instances built ahead of time.
    pub fn has_aot_instance(&self, instance: &Instance) -> bool {
        instance.values.len() == self.params.len()
            && self
                .instance_groups()
                .any(|g| instance.values.iter().all(|(n, v)| g.get(n).is_some_and(|vs| vs.contains(v))))
    }

    /// The generated `msgl_instances.inc` for the AOT build: `MSGL_FOR_EACH_INSTANCE(X)`
    /// expands to `X(v1, v2, ...)` for every instance.
    pub fn instances_include(&self) -> String {
        let mut s = format!(
            "/* Generated by kernel-build from csrc/kernels.toml (family `{}`); do not edit. */\n#define MSGL_FOR_EACH_INSTANCE(X)",
            self.name
        );
        for inst in self.instances() {
            let args: Vec<String> = inst.values.iter().map(|(_, v)| v.to_string()).collect();
            s.push_str(&format!(" X({})", args.join(", ")));
        }
        s.push('\n');
        s
    }

    /// Absolute path of the source under `csrc_dir`.
    pub fn source_path(&self, csrc_dir: &Path) -> PathBuf {
        csrc_dir.join(&self.source)
    }
}

impl Instance {
    /// `(name, value)` pairs in parameter order.
    pub fn values(&self) -> &[(String, i64)] {
        &self.values
    }

    /// The value of parameter `name`.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// The preprocessor definitions that select this instance in a single-instance
    /// (cubin / NVRTC) compile: `MSGL_JIT_INSTANCE` and `MSGL_<PARAM>=<value>`.
    pub fn defines(&self) -> Vec<String> {
        let mut d = vec!["MSGL_JIT_INSTANCE=1".to_owned()];
        d.extend(self.values.iter().map(|(n, v)| format!("MSGL_{n}={v}")));
        d
    }

    /// A file-name-safe tag, e.g. `ROW_BYTES-2048`.
    pub fn tag(&self) -> String {
        let parts: Vec<String> = self.values.iter().map(|(n, v)| format!("{n}-{v}")).collect();
        parts.join("_")
    }

    /// The instance as a JSON-friendly map (manifest entries).
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        self.values.iter().cloned().collect()
    }

    /// Rebuilds an instance from a manifest map, in `family`'s parameter order.
    pub fn from_map(family: &Family, map: &BTreeMap<String, i64>) -> Option<Instance> {
        if map.len() != family.params.len() {
            return None;
        }
        let values = family.params.iter().map(|p| map.get(p).map(|v| (p.clone(), *v))).collect::<Option<Vec<_>>>()?;
        Some(Instance { values })
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.values.iter().map(|(n, v)| format!("{n}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
format = 1
[[family]]
name = "store"
source = "kernels/store.cu"
symbols = ["msgl_store_kv"]
jit_entry = "msgl_store_kv_kernel"
params = ["ROW_BYTES", "PDL"]
instances = { ROW_BYTES = [64, 128], PDL = [0, 1] }
"#;

    #[test]
    fn instances_are_the_cartesian_product_in_param_order() {
        let spec = Spec::parse(SAMPLE, Path::new("kernels.toml")).unwrap();
        let f = spec.family("store").unwrap();
        let tags: Vec<String> = f.instances().iter().map(Instance::to_string).collect();
        assert_eq!(tags, ["ROW_BYTES=64,PDL=0", "ROW_BYTES=64,PDL=1", "ROW_BYTES=128,PDL=0", "ROW_BYTES=128,PDL=1"]);
        assert!(f.instances_include().ends_with("X(64, 0) X(64, 1) X(128, 0) X(128, 1)\n"));
        let inst = f.instance(&[("ROW_BYTES", 128), ("PDL", 1)]).unwrap();
        assert!(f.has_aot_instance(&inst));
        assert!(!f.has_aot_instance(&f.instance(&[("ROW_BYTES", 256), ("PDL", 1)]).unwrap()));
        assert!(f.instance(&[("PDL", 1)]).is_err());
        assert_eq!(inst.defines(), ["MSGL_JIT_INSTANCE=1", "MSGL_ROW_BYTES=128", "MSGL_PDL=1"]);
    }

    #[test]
    fn extra_instance_groups_add_their_own_products_once() {
        let text = format!(
            "{SAMPLE}extra_instances = [{{ ROW_BYTES = [256], PDL = [1] }}, {{ ROW_BYTES = [64, 256], PDL = [1] }}]\n"
        );
        let spec = Spec::parse(&text, Path::new("kernels.toml")).unwrap();
        let f = spec.family("store").unwrap();
        let tags: Vec<String> = f.instances().iter().map(Instance::to_string).collect();
        assert_eq!(
            tags,
            [
                "ROW_BYTES=64,PDL=0",
                "ROW_BYTES=64,PDL=1",
                "ROW_BYTES=128,PDL=0",
                "ROW_BYTES=128,PDL=1",
                "ROW_BYTES=256,PDL=1"
            ]
        );
        assert!(f.has_aot_instance(&f.instance(&[("ROW_BYTES", 256), ("PDL", 1)]).unwrap()));
        // Not a product across the groups: 256 only with PDL 1.
        assert!(!f.has_aot_instance(&f.instance(&[("ROW_BYTES", 256), ("PDL", 0)]).unwrap()));
        assert!(f.instances_include().ends_with("X(128, 1) X(256, 1)\n"));
        let bad = format!("{SAMPLE}extra_instances = [{{ ROW_BYTES = [256] }}]\n");
        assert!(Spec::parse(&bad, Path::new("k.toml")).unwrap_err().to_string().contains("differ"));
        let empty = format!("{SAMPLE}extra_instances = [{{ ROW_BYTES = [], PDL = [1] }}]\n");
        assert!(Spec::parse(&empty, Path::new("k.toml")).unwrap_err().to_string().contains("at least one"));
    }

    #[test]
    fn bad_specs_are_rejected_with_a_reason() {
        let cases = [
            ("format = 2", "format 2"),
            ("format = 1\n[[family]]\nname = \"a\"\nsource = \"a.cpp\"", ".cu path"),
            ("format = 1\n[[family]]\nname = \"a\"\nsource = \"a.cu\"\nsymbols = [\"store\"]", "msgl_"),
            (
                "format = 1\n[[family]]\nname = \"a\"\nsource = \"a.cu\"\nsymbols=[\"msgl_a\"]\nparams = [\"X\"]\ninstances = { Y = [1] }",
                "differ",
            ),
            (
                "format = 1\n[[family]]\nname = \"a\"\nsource = \"a.cu\"\n[[family]]\nname = \"a\"\nsource = \"b.cu\"",
                "twice",
            ),
            ("format = 1\n[[family]]\nname = \"a\"\nsource = \"a.cu\"\nbogus = 1", "bogus"),
        ];
        for (text, needle) in cases {
            let err = Spec::parse(text, Path::new("k.toml")).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }
}
