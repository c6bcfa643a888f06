//! Command line. Every flag can also be set from the environment (`GPUJOB_*`).

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "gpujob-operator",
    version,
    about = "Runs GpuJob custom resources as batch/v1 Jobs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {}
