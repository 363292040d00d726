//! `tiermem run`: the preload library first in `LD_PRELOAD`, the budget in bytes, `--stats`,
//! `--label` and `--no-daemon` passed by environment, JAX's and TensorFlow's allocators pointed at the
//! pool unless chosen, the command's exit status kept, a clear error without the library.

mod support;

use std::path::PathBuf;

/// The preload library cargo built for these tests (a dev-dependency) beside this test binary.
fn preload_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let library = exe.parent().unwrap().join("libtiermem_preload.so");
    assert!(library.is_file(), "{} was not built", library.display());
    library
}

#[test]
fn the_command_runs_preloaded_with_the_budget_and_keeps_its_status() {
    let library = preload_library();
    let script = r#"printf '%s|%s|%s\n' "$LD_PRELOAD" "$TIERMEM_HBM_LIMIT" "$TIERMEM_STATS"; exit 7"#;
    let output = support::tiermem()
        .args(["run", "--hbm-limit", "64MiB", "--stats", "--", "sh", "-c", script])
        .env("TIERMEM_PRELOAD", &library)
        .env("LD_PRELOAD", "libfoo-not-there.so")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(7), "the command's status:\n{stdout}\n{stderr}");
    let expected = format!("{}:libfoo-not-there.so|67108864|1\n", library.canonicalize().unwrap().display());
    assert_eq!(stdout, expected);
}

#[test]
fn frameworks_allocators_are_pointed_at_what_moves_unless_the_environment_or_keep_allocators_says_otherwise() {
    let script = r#"printf '%s|%s|%s\n' "${XLA_PYTHON_CLIENT_ALLOCATOR-unset}" "${TF_GPU_ALLOCATOR-unset}" "${PYTORCH_CUDA_ALLOC_CONF-unset}""#;
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let mut command = support::tiermem();
        command.arg("run").args(extra).args(["--", "sh", "-c", script]).env("TIERMEM_PRELOAD", preload_library());
        for name in ["XLA_PYTHON_CLIENT_ALLOCATOR", "TF_GPU_ALLOCATOR", "PYTORCH_CUDA_ALLOC_CONF"] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert_eq!(run(&[], &[]), "cuda_async|cuda_malloc_async|unset\n");
    assert_eq!(run(&[], &[("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")]), "platform|cuda_malloc_async|unset\n");
    assert_eq!(run(&["--keep-allocators"], &[]), "unset|unset|unset\n");
    let segments = [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:64")];
    assert_eq!(run(&[], &segments), "cuda_async|cuda_malloc_async|expandable_segments:False,max_split_size_mb:64\n");
    assert_eq!(run(&["--keep-allocators"], &segments), "unset|unset|expandable_segments:True,max_split_size_mb:64\n");
}

#[test]
fn stats_come_from_the_command_and_from_descendants_that_used_the_driver_only() {
    // Python, the command, runs `true` twice: neither child loads the driver, so one report.
    let code = "import subprocess\nfor _ in range(2): subprocess.run(['true'], check=True)";
    let output = run_python(&["--stats"], "", code);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stderr.matches("tiermem: stats: 0 allocations").count(), 1, "{stderr}");
    // A child that loaded the driver (the fake one, as libcuda.so.1) reports too.
    let dir = support::TempDir::new("stats-descendants");
    let driver = dir.0.join("libcuda.so.1");
    std::os::unix::fs::symlink(preload_library().with_file_name("libtiermem_fakecuda.so"), &driver).unwrap();
    let code = format!(
        "import ctypes, subprocess\nsubprocess.run(['python3', '-c', 'import ctypes; ctypes.CDLL({:?})'], check=True)",
        driver.display().to_string()
    );
    let output = run_python(&["--stats"], "", &code);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stderr.matches("tiermem: stats: 0 allocations").count(), 2, "{stderr}");
}

#[test]
fn stats_are_printed_when_the_program_exits() {
    // `true` made no CUDA allocation; the library, loaded into it, says so at exit. (A program
    // that ends with _exit, as dash does, skips atexit handlers and prints nothing.)
    let output = support::tiermem()
        .args(["run", "--stats", "--", "true"])
        .env("TIERMEM_PRELOAD", preload_library())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("tiermem: stats: 0 allocations (0 with chunks on the host, 0 refused)"), "{stderr}");
}

#[test]
fn a_missing_library_is_a_clear_error() {
    let output = support::tiermem()
        .args(["run", "--", "true"])
        .env("TIERMEM_PRELOAD", "/nonexistent/libtiermem_preload.so")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("/nonexistent/libtiermem_preload.so not found"), "{stderr}");
    assert!(stderr.contains("TIERMEM_PRELOAD"), "{stderr}");
}

#[test]
fn a_command_that_cannot_start_exits_as_env_would() {
    let dir = support::TempDir::new("run-cannot-start");
    let not_executable = dir.0.join("script");
    std::fs::write(&not_executable, "echo ran\n").unwrap();
    for (command, code, said) in
        [(dir.0.join("missing"), 127, "No such file"), (not_executable, 126, "Permission denied")]
    {
        let output = support::tiermem()
            .arg("run")
            .arg("--")
            .arg(&command)
            .env("TIERMEM_PRELOAD", preload_library())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{stderr}");
        assert!(stderr.contains(&format!("run: starting {}: {said}", command.display())), "{stderr}");
    }
}

#[test]
fn a_bad_budget_is_refused_before_the_command_runs() {
    for bad in ["lots", "150%", "0%"] {
        let output = support::tiermem()
            .args(["run", "--hbm-limit", bad, "--", "sh", "-c", "echo ran"])
            .env("TIERMEM_PRELOAD", preload_library())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{bad}");
        assert!(!String::from_utf8_lossy(&output.stdout).contains("ran"), "{bad}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("--hbm-limit"), "{bad}");
    }
}

#[test]
fn a_budget_may_be_a_share_of_each_gpu() {
    let output = support::tiermem()
        .args(["run", "--hbm-limit", "50%", "--", "sh", "-c", r#"printf '%s\n' "$TIERMEM_HBM_LIMIT""#])
        .env("TIERMEM_PRELOAD", preload_library())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "50%\n", "passed on for the library to take of each GPU");
}

#[test]
fn the_label_and_the_daemon_setting_reach_the_program() {
    let script = r#"printf '%s|%s\n' "$TIERMEM_LABEL" "${TIERMEM_DAEMON-unset}""#;
    let run = |args: &[&str]| {
        let output = support::tiermem()
            .args(["run"])
            .args(args)
            .args(["--", "sh", "-c", script])
            .env("TIERMEM_PRELOAD", preload_library())
            .env_remove("TIERMEM_DAEMON")
            .env_remove("TIERMEM_LABEL")
            .output()
            .unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned())
    };
    assert_eq!(run(&["--label", "training"]), (true, "training|unset\n".to_string()));
    assert_eq!(run(&["--no-daemon"]), (true, "|off\n".to_string()));
    assert!(!run(&["--label", "x", "--no-daemon"]).0, "a label for a daemon it will not use is refused");
}

#[test]
fn the_policy_selects_the_preloads_stages_and_unknown_options_are_refused_not_run() {
    let script = r#"printf '%s|%s\n' "${TIERMEM_MIGRATE-unset}" "${TIERMEM_SEGMENTS-unset}""#;
    let run = |args: &[&str]| {
        let output = support::tiermem()
            .args(["run"])
            .args(args)
            .args(["sh", "-c", script])
            .env("TIERMEM_PRELOAD", preload_library())
            .env_remove("TIERMEM_MIGRATE")
            .env_remove("TIERMEM_SEGMENTS")
            .output()
            .unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned(), output.stderr)
    };
    assert_eq!(run(&["--"]).1, "unset|unset\n", "the preload's own defaults");
    assert_eq!(run(&["--policy", "auto", "--"]).1, "on|on\n");
    assert_eq!(run(&["--policy", "hotness", "--"]).1, "on|off\n");
    assert_eq!(run(&["--policy", "placement", "--"]).1, "off|unset\n");
    for bad in [&["--policy", "lru", "--"][..], &["--hbm-limt", "8GiB", "--"]] {
        let (ok, stdout, stderr) = run(bad);
        assert!(!ok && stdout.is_empty(), "{bad:?} ran the command");
        let stderr = String::from_utf8_lossy(&stderr);
        assert!(stderr.contains(bad[0]) && !stderr.contains("starting"), "{bad:?}: {stderr}");
    }
}

/// A stand-in `torch` package (torch.cuda.memory records what it is asked) and a
/// `sitecustomize` of the program's own, in `dir`; PYTHONPATH naming both.
fn fake_torch(dir: &std::path::Path, refuse: bool) -> String {
    let memory = dir.join("pkgs/torch/cuda");
    std::fs::create_dir_all(&memory).unwrap();
    std::fs::write(dir.join("pkgs/torch/__init__.py"), "from . import _C, cuda\n").unwrap();
    // As PyTorch's own with a pluggable allocator: no statistics.
    std::fs::write(
        dir.join("pkgs/torch/_C.py"),
        "def _cuda_memoryStats(device):\n    raise RuntimeError('does not yet support getDeviceStats')\n",
    )
    .unwrap();
    std::fs::write(memory.join("__init__.py"), "from . import memory\n").unwrap();
    let install =
        if refuse { "raise RuntimeError('CUDA is initialized already')" } else { "calls.append('installed')" };
    let module = format!(
        "calls = []\nclass CUDAPluggableAllocator:\n    def __init__(self, path, malloc, free):\n        \
         calls.append((path, malloc, free))\ndef change_current_allocator(allocator):\n    {install}\n"
    );
    std::fs::write(memory.join("memory.py"), module).unwrap();
    // Inductor's configuration, as PyTorch's: CUDA graph trees on.
    std::fs::create_dir_all(dir.join("pkgs/torch/_inductor")).unwrap();
    std::fs::write(dir.join("pkgs/torch/_inductor/__init__.py"), "").unwrap();
    std::fs::write(dir.join("pkgs/torch/_inductor/config.py"), "class triton:\n    cudagraph_trees = True\n").unwrap();
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(dir.join("site/sitecustomize.py"), "import os\nos.environ['PROGRAM_SITE_RAN'] = 'yes'\n").unwrap();
    format!("{}:{}", dir.join("site").display(), dir.join("pkgs").display())
}

fn run_python(args: &[&str], pythonpath: &str, code: &str) -> std::process::Output {
    support::tiermem()
        .args(["run"])
        .args(args)
        .args(["--", "python3", "-c", code])
        .env("TIERMEM_PRELOAD", preload_library())
        .env("PYTHONPATH", pythonpath)
        .output()
        .unwrap()
}

#[test]
fn torch_allocator_installs_tiermems_allocator_once_torch_is_imported() {
    let dir = support::TempDir::new("torch-hook-installs");
    let pythonpath = fake_torch(&dir.0, false);
    let code = "import os, sys; before = 'torch' in sys.modules; import torch; \
                print(before, torch.cuda.memory.calls, os.environ.get('PROGRAM_SITE_RAN'))";
    let output = run_python(&["--torch-allocator"], &pythonpath, code);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let library = preload_library().canonicalize().unwrap();
    let expected =
        format!("False [('{}', 'tiermem_torch_malloc', 'tiermem_torch_free'), 'installed'] yes\n", library.display());
    assert_eq!(stdout, expected, "installed after `import torch`, the program's sitecustomize run too: {stderr}");
    // Without the flag, PyTorch's allocator stays (and the program's sitecustomize runs as ever).
    let output = run_python(
        &[],
        &pythonpath,
        "import os, torch; print(torch.cuda.memory.calls, os.environ.get('PROGRAM_SITE_RAN'))",
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "[] yes\n");
}

#[test]
fn torch_allocator_turns_inductors_cuda_graph_trees_off() {
    // Graph trees need the caching allocator's pool checkpoints, which PyTorch refuses for a
    // pluggable allocator: with tiermem's installed, torch.compile's reduce-overhead mode gets
    // Inductor's plain CUDA graphs; without it, or when PyTorch refused it, nothing changes.
    let dir = support::TempDir::new("torch-hook-graph-trees");
    let code = "import torch, torch._inductor.config as c; print(c.triton.cudagraph_trees)";
    for (refuse, args, expected) in [
        (false, &["--torch-allocator"][..], "False\n"),
        (false, &[][..], "True\n"),
        (true, &["--torch-allocator"][..], "True\n"),
    ] {
        let pythonpath = fake_torch(&dir.0, refuse);
        let output = run_python(args, &pythonpath, code);
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(stdout, expected, "{args:?}, refused {refuse}: {stderr}");
    }
    // An Inductor whose configuration has no such setting imports as it would, and it is said.
    let pythonpath = fake_torch(&dir.0, false);
    std::fs::write(dir.0.join("pkgs/torch/_inductor/config.py"), "other = 1\n").unwrap();
    let output =
        run_python(&["--torch-allocator"], &pythonpath, "import torch, torch._inductor.config as c; print(c.other)");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout, "1\n", "{stderr}");
    assert!(stderr.contains("after importing torch._inductor.config: AttributeError"), "{stderr}");
}

#[test]
fn torch_allocator_answers_pytorchs_memory_statistics_from_tiermems_counters() {
    let dir = support::TempDir::new("torch-hook-stats");
    let pythonpath = fake_torch(&dir.0, false);
    let code = "import torch; s = torch._C._cuda_memoryStats(0); \
                print(s['allocated_bytes']['all'], s['reserved_bytes']['all']['current'], s['num_ooms'], \
                torch._C._cuda_resetPeakMemoryStats(0), torch._C._cuda_resetAccumulatedMemoryStats(0), \
                torch._C._cuda_emptyCache()); \
                torch._C._cuda_memoryStats(64)";
    let output = run_python(&["--torch-allocator"], &pythonpath, code);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout, "{'current': 0, 'peak': 0, 'allocated': 0, 'freed': 0} 0 0 0 0 None\n", "{stderr}");
    assert!(stderr.contains("memory statistics of GPU 64: no such GPU"), "a GPU out of range raises: {stderr}");
}

#[test]
fn torch_allocator_refused_is_said_and_the_program_goes_on() {
    let dir = support::TempDir::new("torch-hook-refused");
    let pythonpath = fake_torch(&dir.0, true);
    let output = run_python(&["--torch-allocator"], &pythonpath, "import torch; print('went on')");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && stdout == "went on\n", "{stdout}\n{stderr}");
    assert!(
        stderr.contains("--torch-allocator: PyTorch's allocator could not be replaced (CUDA is initialized already)"),
        "{stderr}"
    );
    // A program that never imports torch pays nothing and hears nothing.
    let output = run_python(&["--torch-allocator"], &pythonpath, "import sys; print('torch' in sys.modules)");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "False\n");
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("tiermem"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn torch_allocator_refuses_a_hook_folder_others_may_write_into() {
    let tmp = support::TempDir::new("torch-hook-unsafe");
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let hook = tmp.0.join(format!("tiermem-{uid}-torch-hook"));
    std::fs::create_dir_all(&hook).unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let output = support::tiermem()
        .args(["run", "--torch-allocator", "--", "sh", "-c", "echo ran"])
        .env("TIERMEM_PRELOAD", preload_library())
        .env("TMPDIR", &tmp.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && !String::from_utf8_lossy(&output.stdout).contains("ran"), "{stderr}");
    assert!(stderr.contains("is not a folder of this user's that only it may write into"), "{stderr}");
}
