//! The `tiermem` executable: the program is the library (lib.rs).

fn main() -> std::process::ExitCode {
    tiermem_cli::main(std::env::args_os())
}
