//! Every driver function tiermem exports, calls, or fakes has the C signature `cuda.h` gives it
//! (issue 16: "generate the wrapper table from the CUDA headers"). tiermem's routes swap the
//! driver's *real* function pointers for its wrappers (routes.rs), so no table of names and
//! versions needs generating; what the headers must still decide is each wrapper's signature:
//! a parameter too many, or an `int` where the driver passes a pointer, would be undefined
//! behaviour that no test of the fake driver could catch (the fake was written from the same
//! reading of the header).
//!
//! The signatures come from the sources: every `wrappers!` entry and every exported
//! `extern "C" fn cu…` of the preload library and of the fake driver (`crates/fakecuda`), and
//! each driver function the preload library looks up by name (driver.rs's `entry!` table). Each
//! is described as a list of (kind, size) — integer, pointer, float, or structure by value —
//! return value first. The headers' are the C++ compiler's own reading of `cuda.h` (templates
//! over the declared function's type), in three passes: as a program includes it, with
//! `CUDA_API_PER_THREAD_DEFAULT_STREAM` (the `_ptsz`/`_ptds` variants), and with
//! `__CUDA_API_VERSION_INTERNAL` (the older versions the driver still exports, `cuGetProcAddress`
//! without `_v2`).
//!
//! Headers: `TIERMEM_CUDA_H`, include folders or `cuda.h` files separated by `:` (CI downloads
//! CUDA 12.9's and 13.0's from PyPI's `nvidia-cuda-runtime` wheels); else
//! `/usr/local/cuda/include`. A name must be declared by at least one of them, and every one
//! that declares it must agree. Without any header or C++ compiler the test says so and passes,
//! unless `TIERMEM_REQUIRE_CUDA_H` is set (CI sets it).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// (kind, bytes): `i` integer or enumeration, `p` pointer, `f` floating point, `s` structure.
type Slot = (char, usize);
type Signature = Vec<Slot>;

/// Structures tiermem passes by value, by name: their size.
const BY_VALUE: [(&str, usize); 1] = [("IpcMemHandle", 64)];

fn sources(crate_dir: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                // Comments dropped: they may hold anything, parentheses and colons included.
                let code: Vec<&str> = text.lines().map(|line| line.split("//").next().unwrap_or("")).collect();
                out.push((path.clone(), code.join("\n")));
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(crate_dir).join("src"), &mut out);
    out
}

/// `type Name = Type;` aliases of the sources (those naming one type, not a macro's).
fn aliases(files: &[(PathBuf, String)]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (_, text) in files {
        for line in text.lines().map(str::trim) {
            let line = line.strip_prefix("pub ").unwrap_or(line);
            let Some(rest) = line.strip_prefix("type ") else { continue };
            let Some((name, ty)) = rest.split_once(" = ") else { continue };
            if !ty.contains('$') && ty.ends_with(';') {
                out.entry(name.trim().to_owned()).or_insert_with(|| ty.trim_end_matches(';').trim().to_owned());
            }
        }
    }
    out
}

/// The slot of Rust type `ty`, aliases resolved.
fn slot(ty: &str, aliases: &HashMap<String, String>) -> Slot {
    let ty = ty.trim();
    let last = ty.rsplit("::").next().unwrap_or(ty);
    if ty.starts_with('*') || ty.starts_with('&') || ty.contains("fn(") {
        return ('p', 8);
    }
    match last {
        "u8" | "i8" | "c_char" | "c_uchar" => ('i', 1),
        "u16" | "i16" | "c_ushort" | "c_short" => ('i', 2),
        "u32" | "i32" | "c_uint" | "c_int" => ('i', 4),
        "u64" | "i64" | "usize" | "isize" | "c_ulonglong" | "c_longlong" | "c_ulong" | "c_long" => ('i', 8),
        "f32" | "c_float" => ('f', 4),
        "f64" | "c_double" => ('f', 8),
        _ => match (BY_VALUE.iter().find(|(name, _)| *name == last), aliases.get(last)) {
            (Some(&(_, size)), _) => ('s', size),
            (None, Some(aliased)) => slot(aliased, aliases),
            (None, None) => panic!("signatures: no rule for the Rust type {ty:?}: add it to slot() or BY_VALUE"),
        },
    }
}

/// The types of a Rust parameter list `a: A, b: B` (commas inside brackets kept).
fn parameter_types(list: &str) -> Vec<String> {
    let (mut out, mut depth, mut current) = (Vec::new(), 0i32, String::new());
    for c in list.chars() {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current);
    out.iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.split_once(": ").map_or(p.as_str(), |(_, t)| t).trim().to_owned())
        .collect()
}

/// The text from `open` (an opening parenthesis) to its closing one, exclusive.
fn balanced(text: &str, open: usize) -> &str {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 1 => return &text[open + 1..open + i],
            ')' => depth -= 1,
            _ => {}
        }
    }
    panic!("signatures: unbalanced parentheses after {:?}", &text[open..open.saturating_add(60).min(text.len())])
}

/// Each function's name → the file that gave its signature, and the signature.
type Found = BTreeMap<String, (String, Signature)>;

fn add(found: &mut Found, name: &str, signature: Signature, place: &Path) {
    let place = place.file_name().map_or(String::new(), |f| f.to_string_lossy().into_owned());
    if let Some((first, earlier)) = found.get(name) {
        assert_eq!(earlier, &signature, "{name}: {place} and {first} disagree");
    }
    found.insert(name.to_owned(), (place, signature));
}

/// The signatures of the exported `extern "C" fn cu…`, the `wrappers!` entries and the
/// `entry!(handle, c"cu…", Type)` lookups of `files`.
fn rust_signatures(files: &[(PathBuf, String)], aliases: &HashMap<String, String>) -> Found {
    let mut found = Found::new();
    let signature = |ret: Slot, params: &str| -> Signature {
        std::iter::once(ret).chain(parameter_types(params).iter().map(|t| slot(t, aliases))).collect()
    };
    for (path, text) in files {
        for (at, _) in text.match_indices("extern \"C\" fn cu") {
            let start = at + "extern \"C\" fn ".len();
            let open = start + text[start..].find('(').expect("a parameter list");
            let name = &text[start..open];
            let params = balanced(text, open);
            let after = &text[open + params.len() + 2..];
            let ret =
                after.trim_start().strip_prefix("->").map(|r| r.split(['{', ';', '\n']).next().unwrap_or("").trim());
            if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                add(&mut found, name, signature(slot(ret.unwrap_or("()"), aliases), params), path);
            }
        }
        for (at, _) in text.match_indices("wrappers! {") {
            let body = &text[at..];
            let body = &body[..body.find("\n}").expect("the end of a wrappers! invocation")];
            let mut rest = body[body.find(':').expect("a table name") + 1..].trim_start();
            while let Some(open) = rest.find('(') {
                let name = rest[..open].trim().to_owned();
                let params = balanced(rest, open).to_owned();
                add(&mut found, &name, signature(('i', 4), &params), path);
                rest = rest[open + params.len() + 2..].split_once(';').map_or("", |(_, r)| r).trim_start();
            }
        }
        for (at, _) in text.match_indices("entry!(handle, c\"") {
            let rest = &text[at + "entry!(handle, c\"".len()..];
            let (name, rest) = rest.split_once('"').expect("a quoted name");
            let ty = rest.trim_start_matches(',').split(')').next().expect("a type").trim();
            let function = aliases.get(ty).unwrap_or_else(|| panic!("signatures: {ty} is not a type alias"));
            let open = function.find('(').expect("a function type");
            let params = balanced(function, open);
            let ret = function[open + params.len() + 2..].trim().trim_start_matches("->").trim();
            add(&mut found, name, signature(slot(ret, aliases), params), path);
        }
    }
    found
}

/// Include folders to check against (module documentation).
fn headers() -> Vec<PathBuf> {
    let given = std::env::var("TIERMEM_CUDA_H").unwrap_or_default();
    let mut out: Vec<PathBuf> = std::env::split_paths(&given)
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| if p.is_file() { p.parent().map(Path::to_path_buf).unwrap_or(p) } else { p })
        .collect();
    if out.is_empty() {
        out.push(PathBuf::from("/usr/local/cuda/include"));
    }
    out.retain(|dir| dir.join("cuda.h").is_file());
    out
}

/// The three ways a program includes cuda.h (module documentation).
const PASSES: [&str; 3] = ["", "-DCUDA_API_PER_THREAD_DEFAULT_STREAM", "-D__CUDA_API_VERSION_INTERNAL"];

/// The names `include`'s cuda.h declares in each pass (functions returning `CUresult`).
fn declared(include: &Path, pass: &str, dir: &Path) -> Vec<String> {
    let source = dir.join("declared.cpp");
    std::fs::write(&source, "#include <cuda.h>\n").expect("a scratch file");
    let mut command = Command::new("c++");
    command.args(["-E", "-P", "-I"]).arg(include).arg(&source);
    if !pass.is_empty() {
        command.arg(pass);
    }
    let output = command.output().expect("c++ -E runs");
    assert!(
        output.status.success(),
        "c++ -E {pass} on {}: {}",
        include.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut names = Vec::new();
    for (at, _) in text.match_indices("CUresult ") {
        let rest = text[at + 9..].trim_start();
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if name.starts_with("cu") && rest[name.len()..].trim_start().starts_with('(') {
            names.push(name);
        }
    }
    names
}

/// The header's signature of each of `names` that pass `pass` declares.
fn header_signatures(include: &Path, pass: &str, names: &[&String], dir: &Path) -> HashMap<String, Signature> {
    let mut source = String::from(
        "#include <cuda.h>\n#include <cstdio>\n#include <type_traits>\n\
         template <class T> constexpr char kind() {\n\
           return std::is_pointer<T>::value ? 'p' : std::is_floating_point<T>::value ? 'f'\n\
             : (std::is_integral<T>::value || std::is_enum<T>::value) ? 'i' : 's';\n}\n\
         template <class R, class... A> void describe(const char *name, R (*)(A...)) {\n\
           std::printf(\"%s %c%zu\", name, kind<R>(), sizeof(R));\n\
           ((std::printf(\" %c%zu\", kind<A>(), sizeof(A))), ...);\n\
           std::printf(\"\\n\");\n}\nint main() {\n",
    );
    for name in names {
        source.push_str(&format!("  describe(\"{name}\", &{name});\n"));
    }
    source.push_str("}\n");
    let (cpp, binary) = (dir.join("describe.cpp"), dir.join("describe"));
    std::fs::write(&cpp, source).expect("a scratch file");
    // The functions are only named, never called: linked without libcuda.
    let mut link = Command::new("c++");
    link.args(["-std=c++17", "-Wl,--unresolved-symbols=ignore-all", "-I"])
        .arg(include)
        .arg(&cpp)
        .arg("-o")
        .arg(&binary);
    if !pass.is_empty() {
        link.arg(pass);
    }
    let built = link.output().expect("c++ runs");
    assert!(built.status.success(), "c++ {pass} on {}: {}", include.display(), String::from_utf8_lossy(&built.stderr));
    let run = Command::new(&binary).output().expect("the describing program runs");
    assert!(run.status.success(), "the describing program failed");
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let name = words.next()?.to_owned();
            let slots = words.map(|w| (w.chars().next().unwrap_or('?'), w[1..].parse().unwrap_or(0))).collect();
            Some((name, slots))
        })
        .collect()
}

#[test]
fn every_driver_function_tiermem_exports_calls_or_fakes_has_cuda_hs_signature() {
    let required = std::env::var_os("TIERMEM_REQUIRE_CUDA_H").is_some();
    let includes = headers();
    let compiler = Command::new("c++").arg("--version").output().is_ok_and(|o| o.status.success());
    if includes.is_empty() || !compiler {
        let why = if compiler { "no cuda.h (TIERMEM_CUDA_H)" } else { "no C++ compiler (c++)" };
        assert!(!required, "TIERMEM_REQUIRE_CUDA_H is set but there is {why}");
        eprintln!("signatures: not checked: {why}");
        return;
    }
    let mut checked: Vec<(&str, Found)> = Vec::new();
    for crate_dir in ["preload", "fakecuda"] {
        let files = sources(crate_dir);
        checked.push((crate_dir, rust_signatures(&files, &aliases(&files))));
    }
    let dir = std::env::temp_dir().join(format!("tiermem-signatures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    // name → (header, its signature) for every header that declares it.
    let mut theirs: HashMap<String, Vec<(String, Signature)>> = HashMap::new();
    let ours: Vec<String> = checked.iter().flat_map(|(_, found)| found.keys().cloned()).collect();
    for include in &includes {
        let mut seen: Vec<String> = Vec::new();
        for pass in PASSES {
            let declared = declared(include, pass, &dir);
            let wanted: Vec<&String> = ours
                .iter()
                .filter(|n| declared.contains(n) && !seen.contains(n))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            for (name, signature) in header_signatures(include, pass, &wanted, &dir) {
                theirs.entry(name.clone()).or_default().push((include.display().to_string(), signature));
                seen.push(name);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut wrong = Vec::new();
    let mut count = 0;
    for (crate_dir, found) in &checked {
        for (name, (file, signature)) in found {
            if name.starts_with("nvml") {
                continue; // nvml.h is not among the headers
            }
            let Some(declarations) = theirs.get(name) else {
                wrong.push(format!("{crate_dir}/{file}: {name} is declared by none of {includes:?}"));
                continue;
            };
            count += 1;
            for (header, theirs) in declarations {
                if theirs != signature {
                    wrong.push(format!(
                        "{crate_dir}/{file}: {name} is {signature:?} here, {theirs:?} in {header}/cuda.h"
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "signatures that differ from cuda.h:\n{}", wrong.join("\n"));
    eprintln!("signatures: {count} functions agree with {} header(s): {includes:?}", includes.len());
    assert!(count > 100, "only {count} signatures found in the sources: the parser missed some");
}
