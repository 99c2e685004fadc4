//! The module layout's one rule, checked: imports between files never go
//! both ways, and neither do imports between the groups (`request/`,
//! `connect/`, `pool/`, `export/`, `kernel/` and the top-level files), test
//! modules aside (see docs/ARCHITECTURE.md, "Library modules").

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `crate::x::y` paths named outside test modules and comments, by file
/// (`pool/model`), each resolved to the file it names (`crate::Name`
/// through lib.rs's re-exports).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let mut reexports = BTreeMap::new();
    for item in lib.split(';') {
        let Some(rest) = item.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (module, names) = rest.split_once("::{").unwrap_or_else(|| {
            let (m, n) = rest.rsplit_once("::").expect("a path");
            (m, n)
        });
        for name in names.split([',', '}', ' ', '\n']).filter(|n| !n.is_empty()) {
            reexports.insert(name.to_owned(), module.replace("::", "/"));
        }
    }
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).expect("src dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut out = BTreeMap::new();
    for path in files {
        let rel = path
            .strip_prefix(&src)
            .expect("under src")
            .with_extension("");
        let module = rel.to_string_lossy().trim_end_matches("/mod").to_owned();
        let text = std::fs::read_to_string(&path).expect("source");
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .and_then(|code| code.split("#[cfg(test)]\npub(crate) mod tests").next())
            .unwrap_or("");
        let mut named = BTreeSet::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let path: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let mut parts = path.split("::").filter(|p| !p.is_empty());
                let Some(first) = parts.next() else { continue };
                let target = if first.starts_with(char::is_uppercase) {
                    reexports
                        .get(first)
                        .cloned()
                        .unwrap_or_else(|| first.to_owned())
                } else {
                    match parts.next() {
                        Some(second) if !second.starts_with(char::is_uppercase) => {
                            format!("{first}/{second}")
                        }
                        _ => first.to_owned(),
                    }
                };
                named.insert(target);
            }
        }
        out.insert(module, named);
    }
    out
}

fn group(module: &str) -> &str {
    module.split('/').next().unwrap_or(module)
}

#[test]
fn no_two_files_and_no_two_groups_import_each_other() {
    let imports = imports();
    assert!(imports.len() > 30, "read the sources: {:?}", imports.keys());
    let mut edges = BTreeSet::new();
    for (from, targets) in &imports {
        for to in targets {
            edges.insert((from.as_str(), to.as_str()));
        }
    }
    let files: Vec<_> = edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(*b, *a)))
        .collect();
    assert!(files.is_empty(), "files importing each other: {files:?}");
    let groups: BTreeSet<_> = edges
        .iter()
        .map(|(a, b)| (group(a), group(b)))
        .filter(|(a, b)| a != b)
        .collect();
    let both: Vec<_> = groups
        .iter()
        .filter(|(a, b)| a < b && groups.contains(&(*b, *a)))
        .collect();
    assert!(both.is_empty(), "groups importing each other: {both:?}");
}
