//! gpujob-operator: runs `GpuJob` custom resources as batch/v1 Jobs.

mod cli;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    match cli.command {
        // The reconcile core lands with the GpuJob API; until then the binary only
        // answers --help and --version so packaging and CI can be wired up.
        None => {
            eprintln!("gpujob-operator: no command given; see --help");
            std::process::exit(2);
        }
    }
}
