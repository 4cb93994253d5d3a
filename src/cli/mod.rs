//! The `shardfs` command line.

mod inspect;
mod scan;
mod verify;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use thiserror::Error;

/// Zarr v3 shards, written as plain chunk files.
#[derive(Parser, Debug)]
#[command(name = "shardfs", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the index of a shard file, or of every shard of an array directory.
    ///
    /// For a shard file, the array's zarr.json is looked up in the parent directories.
    /// Exit status: 0 when every index could be read and its checksum matches, 1 when not,
    /// 2 on usage or I/O errors.
    Inspect {
        /// A shard file or an array directory.
        path: PathBuf,
        /// Print JSON: one object per shard file, a list of them for an array directory.
        #[arg(long)]
        json: bool,
    },
    /// Check an array or a whole hierarchy: metadata documents and every shard.
    ///
    /// Prints one line per problem, naming the file and the fault. Exit status: 0 when all
    /// is sound, 1 when anything is wrong, 2 on usage or I/O errors.
    Verify {
        /// An array directory, a group directory, or any directory holding Zarr nodes.
        path: PathBuf,
    },
}

/// Errors that stop a command before it can give a verdict (exit status 2).
#[derive(Debug, Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CliError {
    pub fn io(path: &Path, source: std::io::Error) -> CliError {
        CliError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A command's verdict: everything sound, or problems found (exit status 1).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Sound,
    Problems,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { path, json } => inspect::run(&path, json),
        Command::Verify { path } => verify::run(&path),
    };
    match result {
        Ok(Verdict::Sound) => ExitCode::SUCCESS,
        Ok(Verdict::Problems) => ExitCode::from(1),
        Err(e) => {
            eprintln!("shardfs: {e}");
            ExitCode::from(2)
        }
    }
}
