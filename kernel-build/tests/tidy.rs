//! kernels.toml and csrc/ agree: every .cu under csrc/kernels is listed, every
//! listed source exists, every listed symbol is defined as extern "C" there, and
//! every extern "C" msgl_ symbol of a source is listed.

use std::path::Path;

use kernel_build::aot::spec_mismatches;
use kernel_build::Spec;

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

#[test]
fn the_repository_spec_matches_csrc() {
    let csrc = kernel_build::workspace_csrc_dir();
    let spec = Spec::load(&csrc).unwrap();
    let problems = spec_mismatches(&csrc, &spec).unwrap();
    assert!(problems.is_empty(), "kernels.toml and csrc/ disagree:\n{}", problems.join("\n"));
    // Every header the kernels include is under csrc/include.
    for family in &spec.families {
        let text = std::fs::read_to_string(family.source_path(&csrc)).unwrap();
        for line in text.lines().filter(|l| l.trim_start().starts_with("#include \"minisgl/")) {
            let name = line.split('"').nth(1).unwrap();
            assert!(csrc.join("include").join(name).is_file(), "{}: {name} is not under csrc/include", family.source);
        }
    }
}

#[test]
fn mismatches_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let csrc = tmp.path().join("csrc");
    copy_dir(&kernel_build::workspace_csrc_dir(), &csrc);
    // An unlisted .cu file.
    std::fs::write(csrc.join("kernels/stray.cu"), "extern \"C\" int msgl_stray() { return 0; }\n").unwrap();
    // A listed symbol that the source no longer defines.
    let index = csrc.join("kernels/index.cu");
    let text = std::fs::read_to_string(&index).unwrap().replace(" msgl_index(", " msgl_index_renamed(");
    std::fs::write(&index, text).unwrap();
    let spec = Spec::load(&csrc).unwrap();
    let problems = spec_mismatches(&csrc, &spec).unwrap().join("\n");
    assert!(problems.contains("csrc/kernels/stray.cu is not listed"), "{problems}");
    assert!(problems.contains("symbol `msgl_index` is not defined"), "{problems}");
    assert!(problems.contains("defines `msgl_index_renamed`, which kernels.toml does not list"), "{problems}");
    // A listed source that does not exist.
    std::fs::remove_file(csrc.join("kernels/store.cu")).unwrap();
    let problems = spec_mismatches(&csrc, &spec).unwrap().join("\n");
    assert!(problems.contains("source csrc/kernels/store.cu does not exist"), "{problems}");
}
