use std::process::ExitCode;

fn main() -> ExitCode {
    shardfs::cli::main()
}
