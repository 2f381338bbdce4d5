//! `burn-gguf`: run llama.cpp GGUF models on Burn through wgpu.
use burn_gguf_cli::fetch;
use burn_gguf_cli::run::SpecArgs;
use burn_gguf_cli::run::{RunOptions, run};
use burn_gguf_cli::serve::models::resolve_one;
use burn_gguf_models::SamplerConfig;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "burn-gguf",
    version,
    about = "Run llama.cpp GGUF models on Burn (wgpu: Vulkan, Metal, WebGPU)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Sampling options shared by `run` and `chat`.
#[derive(clap::Args)]
struct Sampling {
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Top-k (0 keeps all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (1 keeps all).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// LoRA adapters applied by `run` and `chat`.
#[derive(clap::Args)]
struct Lora {
    /// A LoRA adapter in llama.cpp's GGUF format (as `finetune` writes); repeat to apply
    /// several together.
    #[arg(long = "lora", value_name = "FILE")]
    files: Vec<std::path::PathBuf>,
    /// The factor of the adapters' updates (llama.cpp `--lora-scaled`).
    #[arg(long, default_value_t = 1.0)]
    lora_scale: f32,
}

impl From<Sampling> for SamplerConfig {
    fn from(s: Sampling) -> Self {
        SamplerConfig {
            temperature: s.temp,
            top_k: s.top_k,
            top_p: s.top_p,
            seed: s.seed,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run {
        /// A GGUF file, a Hugging Face `org/repo:file.gguf` (hub cache, else downloaded), or a
        /// known model name fetched into the cache on first use (gemma3-270m).
        #[arg(short, long)]
        model: String,
        /// The prompt.
        #[arg(short, long)]
        prompt: String,
        /// Most new tokens.
        #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
        n_predict: usize,
        #[command(flatten)]
        sampling: Sampling,
        #[command(flatten)]
        spec: SpecArgs,
        /// Print one JSON object (prompt_ids, generated_ids, text, timings) instead of streaming.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        lora: Lora,
        /// Write the prompt's teacher-forced logits to this file (`[prompt tokens, vocab]`
        /// little-endian f32), to compare with another implementation.
        #[arg(long, value_name = "FILE")]
        dump_logits: Option<std::path::PathBuf>,
        /// Dequantize all weights at load (no packed kernels).
        #[arg(long)]
        dequantize: bool,
        /// Device: an index or part of a name from `burn-gguf devices`, or `cpu` (Burn's CPU
        /// backend, every weight dequantized); the default wgpu adapter when absent.
        #[arg(long)]
        device: Option<String>,
    },
    /// Chat with a model: each line of standard input is a user message, each reply is printed
    /// (the file's chat template; the history's KV cache is reused). `/exit` or end of input ends.
    Chat {
        /// A GGUF file, a Hugging Face `org/repo:file.gguf` (hub cache, else downloaded), or a
        /// known model name fetched into the cache on first use (gemma3-270m).
        #[arg(short, long)]
        model: String,
        /// A system message.
        #[arg(long)]
        system: Option<String>,
        /// Most new tokens per reply.
        #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
        n_predict: usize,
        #[command(flatten)]
        sampling: Sampling,
        #[command(flatten)]
        spec: SpecArgs,
        #[command(flatten)]
        lora: Lora,
        /// Dequantize all weights at load (no packed kernels).
        #[arg(long)]
        dequantize: bool,
        /// Device: an index or part of a name from `burn-gguf devices`, or `cpu` (Burn's CPU
        /// backend, every weight dequantized); the default wgpu adapter when absent.
        #[arg(long)]
        device: Option<String>,
    },
    /// Train a LoRA adapter over the model's packed weights (they stay quantized and frozen)
    /// and write it in llama.cpp's adapter format (`llama-cli --lora`, `run --lora`).
    Finetune {
        /// A GGUF file, a Hugging Face `org/repo:file.gguf`, or a known model name.
        #[arg(short, long)]
        model: String,
        /// Training data: plain text (a causal LM over the whole text), or `.jsonl` chat, one
        /// `{"messages": [{"role": ..., "content": ...}, ...]}` a line (loss on the
        /// assistant's tokens only).
        #[arg(long)]
        data: std::path::PathBuf,
        /// The adapter file to write (and checkpoint).
        #[arg(long)]
        out: std::path::PathBuf,
        /// LoRA rank.
        #[arg(long, default_value_t = 8)]
        rank: usize,
        /// LoRA alpha: updates are scaled by alpha / rank.
        #[arg(long, default_value_t = 16.0)]
        alpha: f32,
        /// Dropout on the adapters' inputs.
        #[arg(long, default_value_t = 0.0)]
        dropout: f64,
        /// The projections adapted, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down"
        )]
        targets: Vec<String>,
        /// Optimizer steps.
        #[arg(long, default_value_t = 100)]
        steps: usize,
        /// Learning rate (AdamW).
        #[arg(long, default_value_t = 1e-4)]
        lr: f64,
        /// Sequences per forward pass (one pass over all of them).
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Passes per optimizer step, their gradients accumulated (an effective batch of
        /// batch x grad-accum sequences).
        #[arg(long, default_value_t = 1)]
        grad_accum: usize,
        /// Tokens per training sequence.
        #[arg(long, default_value_t = 256)]
        seq_len: usize,
        /// Seed of the adapters' initialisation order and the data order.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write the adapter every this many steps (0: only at the end).
        #[arg(long, default_value_t = 50)]
        checkpoint_every: usize,
        /// Device, as for `run` (`cpu`: Burn's CPU backend).
        #[arg(long)]
        device: Option<String>,
    },
    /// Show a GGUF file: header, metadata, tensors, type histogram; or one tensor's values.
    Inspect {
        /// A GGUF file, or a known model name.
        file: String,
        /// Print this tensor's dequantized values, one per line, in Burn row-major order.
        #[arg(long)]
        tensor: Option<String>,
        /// With --tensor: compute the values with the device kernels instead of the CPU codec.
        #[arg(long, requires = "tensor")]
        kernels: bool,
    },
    /// Serve models over an OpenAI-compatible HTTP API (/v1/chat/completions,
    /// /v1/completions, /v1/models, /health). Ctrl-C or SIGTERM finishes running requests and
    /// exits.
    Serve(burn_gguf_cli::serve::ServeOptions),
    /// List the wgpu adapters `--device` can name (index, name, type, graphics API, driver).
    Devices,
    /// Download a known model into the cache and print its path.
    Fetch {
        /// Model name: gemma3-270m.
        name: String,
    },
}

/// Prints every wgpu adapter, then the CPU choice.
fn list_devices() {
    let adapters = burn_gguf::adapters();
    if adapters.is_empty() {
        println!("no wgpu adapter found (install a Vulkan driver: mesa-vulkan-drivers)");
    }
    for a in &adapters {
        let kind = a
            .kind
            .as_ref()
            .map_or("not addressable".to_string(), |k| format!("{k:?}"));
        println!(
            "{}: {} ({}, {}, driver {}; Burn DeviceKind {kind})",
            a.index, a.name, a.device_type, a.backend, a.driver
        );
    }
    println!("cpu: Burn's CPU backend (burn-flex; every weight dequantized at load)");
}

fn main() -> ExitCode {
    // Before any thread exists: Mesa's drivers print `error: XDG_RUNTIME_DIR is invalid or not
    // set` to stderr when it is unset, so the CLI gives them a private one.
    burn_gguf_cli::host::use_private_runtime_dir();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,wgpu_hal::gles=off")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            model,
            prompt,
            n_predict,
            sampling,
            spec,
            json,
            lora,
            dump_logits,
            dequantize,
            device,
        } => resolve_one(&model).and_then(|path| {
            let opts = RunOptions {
                dump_logits,
                prompt,
                max_new: n_predict,
                sampler: sampling.into(),
                spec,
                dequantize,
                json,
                progress: !json,
                device,
                lora: lora.files,
                lora_scale: lora.lora_scale,
            };
            run(&path, &opts)
        }),
        Command::Chat {
            model,
            system,
            n_predict,
            sampling,
            spec,
            lora,
            dequantize,
            device,
        } => resolve_one(&model).and_then(|path| {
            let opts = burn_gguf_cli::chat::ChatOptions {
                system,
                max_new: n_predict,
                sampler: sampling.into(),
                spec,
                dequantize,
                device,
                lora: lora.files,
                lora_scale: lora.lora_scale,
            };
            burn_gguf_cli::chat::chat(&path, &opts, std::io::stdin().lock(), std::io::stdout())
        }),
        Command::Inspect {
            file,
            tensor,
            kernels,
        } => resolve_one(&file)
            .and_then(|path| burn_gguf_cli::inspect::run(&path, tensor.as_deref(), kernels)),
        Command::Finetune {
            model,
            data,
            out,
            rank,
            alpha,
            dropout,
            targets,
            steps,
            lr,
            batch,
            grad_accum,
            seq_len,
            seed,
            checkpoint_every,
            device,
        } => resolve_one(&model).and_then(|path| {
            let opts = burn_gguf_cli::finetune::FinetuneOptions {
                data,
                out,
                lora: burn_gguf::LoraConfig {
                    rank,
                    alpha,
                    dropout,
                    targets,
                },
                steps,
                train: burn_gguf_models::finetune::TrainConfig {
                    lr,
                    batch,
                    grad_accum,
                    seed,
                    ..Default::default()
                },
                seq_len,
                checkpoint_every,
                device,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            };
            burn_gguf_cli::finetune::finetune(&path, &opts)
        }),
        Command::Devices => {
            list_devices();
            Ok(())
        }
        Command::Serve(opts) => burn_gguf_cli::serve::serve(&opts),
        Command::Fetch { name } => fetch::ensure_model(&name)
            .map(|p| println!("{}", p.display()))
            .map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
