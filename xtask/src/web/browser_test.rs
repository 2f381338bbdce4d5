//! `cargo xtask web-test`: the page (`cargo xtask web`) in a real browser, Debian's headless
//! Chromium with WebGPU (SwiftShader where there is no GPU), served from 127.0.0.1 and driven
//! through chromedriver. Checks, each from the page's `RESULT`/`ERROR` console line:
//! - the tiny Qwen3 fixture's greedy ids in the page equal the native CLI's
//!   (`burn-gguf run --json`) for the same prompt, and two chat turns' replies equal
//!   `burn-gguf chat`'s, the second turn reusing the first's cache;
//! - the browser's kernel checks (`index.html?check=kernels`) all pass;
//! - a truncated and a hostile GGUF each show an error in the page, and the same page then
//!   still generates (the first check's ids again);
//! - with `--gemma PATH`, the model's greedy ids for "Once upon a time" equal the native CLI's,
//!   with its load time and tokens/s printed (and `--screenshot FILE` saves the page).
use super::serve::Server;
use super::webdriver::Browser;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The prompt of the tiny-fixture check.
const TINY_PROMPT: &str = "The quick brown fox";
/// Tokens generated in the tiny-fixture check.
const TINY_TOKENS: usize = 16;

/// Options of `cargo xtask web-test`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Build the page here (default: `page` in the web target directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also run this GGUF (Gemma 3 270M Q4_K_M) in the page and compare its greedy ids for
    /// "Once upon a time" with the native CLI's.
    #[arg(long)]
    pub gemma: Option<PathBuf>,
    /// Tokens the --gemma run generates.
    #[arg(long, default_value_t = 32)]
    pub gemma_tokens: usize,
    /// Save a PNG of the page after the --gemma run (else after the tiny run).
    #[arg(long)]
    pub screenshot: Option<PathBuf>,
    /// The browser (Debian's chromium).
    #[arg(long, default_value = "/usr/bin/chromium")]
    pub chromium: PathBuf,
    /// Its driver (Debian's chromium-driver).
    #[arg(long, default_value = "/usr/bin/chromedriver")]
    pub chromedriver: PathBuf,
    /// Seconds a page may take for one result.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
}

/// Runs the browser tests; prints what each found.
///
/// # Errors
/// Any check failing, with what was seen.
pub fn run(opts: &Options) -> Result<(), String> {
    let root = super::workspace_root();
    let fixtures = root.join("../shared/fixtures");
    let tiny_rel = "gguf/tiny-qwen3-Q8_0.gguf";
    let tiny = fixtures.join(tiny_rel);
    if !tiny.is_file() {
        return Err(format!("{}: missing (the shared fixtures)", tiny.display()));
    }
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| super::web_target_dir().join("page"));
    super::build(&out)?;
    let cli = native_cli()?;

    // Bad files, made from the fixture: cut in the tensor data, and a header claiming 2^40
    // tensors.
    let bad = std::env::temp_dir().join(format!("burn-gguf-web-bad-{}", std::process::id()));
    std::fs::create_dir_all(&bad).map_err(|e| format!("{}: {e}", bad.display()))?;
    let bytes = std::fs::read(&tiny).map_err(|e| format!("{}: {e}", tiny.display()))?;
    std::fs::write(bad.join("truncated.gguf"), &bytes[..bytes.len() * 3 / 5])
        .map_err(|e| e.to_string())?;
    let mut hostile = bytes[..24].to_vec();
    hostile[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(bad.join("hostile.gguf"), &hostile).map_err(|e| e.to_string())?;

    let mut mounts = vec![
        ("/".to_string(), out.clone()),
        ("/fixtures/".to_string(), fixtures.clone()),
        ("/bad/".to_string(), bad.clone()),
    ];
    if let Some(g) = &opts.gemma {
        let dir = g.parent().ok_or("--gemma: no folder")?.to_path_buf();
        mounts.push(("/models/".to_string(), dir));
    }
    let server = Server::start(mounts).map_err(|e| format!("static server: {e}"))?;
    let browser = Browser::start(&opts.chromium, &opts.chromedriver)?;
    let timeout = Duration::from_secs(opts.timeout);
    let mut failures = Vec::new();

    // 1. The tiny fixture's greedy ids against the native CLI's.
    let native = native_run(&cli, &tiny, TINY_PROMPT, TINY_TOKENS)?;
    let page = format!(
        "/index.html?model=/fixtures/{tiny_rel}&prompt={}&n={TINY_TOKENS}&temp=0",
        encode(TINY_PROMPT)
    );
    let t0 = Instant::now();
    browser.goto(&server.url(&page))?;
    let web = result_line(&browser, timeout)?;
    report_ids("tiny qwen3 Q8_0", &native, &web, t0, &mut failures);
    // 1b. Two chat turns in the same page (the model's template, the KV cache kept between
    // turns) against `burn-gguf chat`'s replies.
    let t0 = Instant::now();
    check_chat(&browser, &cli, &tiny, t0, &mut failures)?;
    if opts.gemma.is_none()
        && let Some(path) = &opts.screenshot
    {
        save_screenshot(&browser, path)?;
    }

    // 2. The browser's kernel checks.
    let t0 = Instant::now();
    browser.goto(&server.url("/index.html?check=kernels"))?;
    match result_line(&browser, timeout)? {
        Ok(v) => {
            for c in v["cases"].as_array().into_iter().flatten() {
                println!(
                    "  {:<4} {:<44} {:>22} {}",
                    if c["passed"] == true { "ok" } else { "FAIL" },
                    c["variant"].as_str().unwrap_or(""),
                    c["shape"].as_str().unwrap_or(""),
                    c["err"]
                        .as_f64()
                        .map_or_else(|| c["error"].to_string(), |e| format!("{e:.3}"))
                );
            }
            let (passed, failed) = (v["passed"].as_u64(), v["failed"].as_u64());
            println!(
                "kernel checks in the browser: {} passed, {} failed ({:.1} s)",
                passed.unwrap_or(0),
                failed.unwrap_or(0),
                t0.elapsed().as_secs_f64()
            );
            if failed != Some(0) || passed.unwrap_or(0) == 0 {
                failures.push("browser kernel checks".to_string());
            }
        }
        Err(e) => failures.push(format!("browser kernel checks: ERROR {e}")),
    }

    // 3. Bad files: an error shown in the page, and the page still generates afterwards.
    for name in ["truncated.gguf", "hostile.gguf"] {
        let page = format!("/index.html?model=/bad/{name}&prompt=x&n=4&temp=0");
        browser.goto(&server.url(&page))?;
        match result_line(&browser, timeout)? {
            Err(e) => {
                let shown = browser.execute(
                    "return document.getElementById('error').textContent",
                    json!([]),
                )?;
                let shown = shown.as_str().unwrap_or("");
                println!("{name}: ERROR {e}; the page shows {shown:?}");
                if shown.is_empty() {
                    failures.push(format!("{name}: no error shown in the page"));
                }
            }
            Ok(v) => failures.push(format!("{name}: loaded and generated {v}")),
        }
        let t0 = Instant::now();
        let again = browser.execute_async(
            "const done = arguments[arguments.length - 1];\
             window.burnGguf.run(arguments[0]).then(done, (e) => done({error: e.message}));",
            json!([{"model": format!("/fixtures/{tiny_rel}"), "prompt": TINY_PROMPT,
                    "n": TINY_TOKENS, "temp": 0}]),
        )?;
        let again = match again.get("error") {
            Some(e) => Err(e.to_string()),
            None => Ok(again),
        };
        report_ids(
            &format!("after {name}, the same page"),
            &native,
            &again,
            t0,
            &mut failures,
        );
    }

    // 4. Gemma 3 270M, by hand.
    if let Some(gemma) = &opts.gemma {
        let prompt = "Once upon a time";
        let native = native_run(&cli, gemma, prompt, opts.gemma_tokens)?;
        let name = gemma
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("--gemma: no file name")?;
        let page = format!(
            "/index.html?model=/models/{name}&prompt={}&n={}&temp=0",
            encode(prompt),
            opts.gemma_tokens
        );
        let t0 = Instant::now();
        browser.goto(&server.url(&page))?;
        let web = result_line(&browser, timeout)?;
        report_ids(name, &native, &web, t0, &mut failures);
        if let Ok(v) = &web {
            let t = &v["timings"];
            println!(
                "{name} in the page: load {:.1} s, prompt {} tokens at {:.2} tokens/s, \
                 decode {} tokens at {:.3} tokens/s; text {:?}",
                t["load_ms"].as_f64().unwrap_or(0.0) / 1e3,
                t["prompt_tokens"],
                t["prompt_tokens_per_s"].as_f64().unwrap_or(0.0),
                t["decode_tokens"],
                t["decode_tokens_per_s"].as_f64().unwrap_or(0.0),
                v["text"].as_str().unwrap_or("")
            );
        }
        if let Some(path) = &opts.screenshot {
            save_screenshot(&browser, path)?;
        }
    }
    let _ = std::fs::remove_dir_all(&bad);
    if failures.is_empty() {
        println!("web-test: all checks passed");
        Ok(())
    } else {
        Err(format!("web-test failed: {}", failures.join("; ")))
    }
}

/// The user messages of the chat check.
const CHAT_TURNS: [&str; 2] = ["Hello there", "And then?"];

/// Two greedy chat turns of 8 tokens on the loaded page's model against `burn-gguf chat` on
/// `model`: the replies' text must be equal, and the second turn must run only its new tokens
/// (the first turn's cache reused).
fn check_chat(
    browser: &Browser,
    cli: &Path,
    model: &Path,
    t0: Instant,
    failures: &mut Vec<String>,
) -> Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new(cli)
        .arg("chat")
        .arg("-m")
        .arg(model)
        .args(["-n", "8", "--temp", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", cli.display()))?;
    let mut stdin = child.stdin.take().ok_or("chat: no stdin")?;
    writeln!(stdin, "{}\n{}", CHAT_TURNS[0], CHAT_TURNS[1]).map_err(|e| e.to_string())?;
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let native: Vec<&str> = stdout.lines().collect();
    let page = browser.execute_async(
        "const done = arguments[arguments.length - 1];\
         const [first, second] = arguments[0];\
         const ask = (messages) => window.burnGguf.generate(\
             {messages, max_tokens: 8, temperature: 0});\
         (async () => {\
           const a = await ask([{role: 'user', content: first}]);\
           const b = await ask([{role: 'user', content: first},\
             {role: 'assistant', content: a.text.trim()}, {role: 'user', content: second}]);\
           return [a, b];\
         })().then(done, (e) => done({error: e.message}));",
        json!([CHAT_TURNS]),
    )?;
    if let Some(e) = page.get("error") {
        failures.push(format!("chat in the page: {e}"));
        println!("chat in the page: ERROR {e}");
        return Ok(());
    }
    let replies: Vec<&str> = (0..2)
        .map(|i| page[i]["text"].as_str().unwrap_or(""))
        .collect();
    let same = native.len() >= 2
        && replies
            .iter()
            .zip(&native)
            .all(|(p, n)| p.trim() == n.trim());
    let (prompt, ran) = (
        page[1]["prompt_ids"].as_array().map_or(0, Vec::len),
        page[1]["timings"]["prompt_tokens"]
            .as_u64()
            .unwrap_or(u64::MAX) as usize,
    );
    println!(
        "chat, two turns in the page: {} ({:.1} s); the second turn ran {ran} of its {prompt} \
         prompt tokens\n  page   {replies:?}\n  native {native:?}",
        if same {
            "replies equal `burn-gguf chat`'s"
        } else {
            "REPLIES DIFFER from `burn-gguf chat`'s"
        },
        t0.elapsed().as_secs_f64(),
    );
    if !same {
        failures.push("chat: replies differ".into());
    }
    if ran >= prompt {
        failures.push(format!(
            "chat: the second turn ran {ran} of {prompt} tokens (no cache reuse)"
        ));
    }
    Ok(())
}

/// The CLI binary beside this one, built first (a no-op when it is current).
fn native_cli() -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .current_dir(super::workspace_root())
        .args(["build", "-q", "-p", "burn-gguf-cli"])
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !status.success() {
        return Err("building burn-gguf-cli failed".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Ok(exe.with_file_name("burn-gguf"))
}

/// `burn-gguf run --json` greedy on `model`.
fn native_run(cli: &Path, model: &Path, prompt: &str, n: usize) -> Result<Value, String> {
    let out = std::process::Command::new(cli)
        .arg("run")
        .arg("-m")
        .arg(model)
        .args(["-p", prompt, "-n", &n.to_string(), "--temp", "0", "--json"])
        .output()
        .map_err(|e| format!("{}: {e}", cli.display()))?;
    if !out.status.success() {
        return Err(format!(
            "native run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| format!("native run printed no JSON: {stdout}"))?;
    serde_json::from_str(line).map_err(|e| format!("native run JSON: {e}"))
}

/// Waits for the page's `RESULT {json}` (Ok) or `ERROR {json}` (Err with the message) console
/// line.
fn result_line(browser: &Browser, timeout: Duration) -> Result<Result<Value, String>, String> {
    let t0 = Instant::now();
    loop {
        for line in browser.console()? {
            if let Some(json) = line.strip_prefix("RESULT ") {
                return serde_json::from_str(json)
                    .map(Ok)
                    .map_err(|e| format!("RESULT line: {e}"));
            }
            if let Some(json) = line.strip_prefix("ERROR ") {
                let v: Value =
                    serde_json::from_str(json).map_err(|e| format!("ERROR line: {e}"))?;
                return Ok(Err(v["message"].as_str().unwrap_or(json).to_string()));
            }
            // Everything else the page logged (shader compiler messages, panics), shortened.
            let short: String = line.chars().take(1500).collect();
            eprintln!("  console: {short}");
        }
        if t0.elapsed() > timeout {
            return Err(format!(
                "no RESULT or ERROR line within {} s",
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Compares a page's ids with the native run's and prints both.
fn report_ids(
    what: &str,
    native: &Value,
    web: &Result<Value, String>,
    t0: Instant,
    failures: &mut Vec<String>,
) {
    let web = match web {
        Ok(v) => v,
        Err(e) => {
            println!("{what}: ERROR {e}");
            failures.push(format!("{what}: {e}"));
            return;
        }
    };
    let same = web["prompt_ids"] == native["prompt_ids"]
        && web["generated_ids"] == native["generated_ids"];
    println!(
        "{what}: {} ({:.1} s in the page)\n  page   {} -> {}\n  native {} -> {}",
        if same {
            "ids equal the native CLI's"
        } else {
            "IDS DIFFER from the native CLI's"
        },
        t0.elapsed().as_secs_f64(),
        web["prompt_ids"],
        web["generated_ids"],
        native["prompt_ids"],
        native["generated_ids"]
    );
    if !same {
        failures.push(format!("{what}: ids differ"));
    }
}

fn save_screenshot(browser: &Browser, path: &Path) -> Result<(), String> {
    let png = browser.screenshot()?;
    std::fs::write(path, png).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("screenshot: {}", path.display());
    Ok(())
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
