//! The few W3C WebDriver commands the browser tests use, spoken to Debian's `chromedriver`
//! (package chromium-driver) driving Debian's `chromium` headless with WebGPU: never a browser
//! a tool downloads for itself.
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Chromium under chromedriver, one session; both end when this is dropped.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: TempDir,
}

/// A folder removed on drop (Chromium's profile).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Chromium's flags: headless with WebGPU on its software adapter (SwiftShader) where the
/// machine has no GPU, and none of the background connections a closed network refuses.
const CHROMIUM_ARGS: [&str; 11] = [
    "--headless=new",
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--window-size=1000,1400",
    "--js-flags=--max-old-space-size=4096",
];

impl Browser {
    /// Starts `chromedriver` on a free port of 127.0.0.1 and a session of `chromium` (headless,
    /// WebGPU on, a fresh profile, console messages logged).
    ///
    /// # Errors
    /// Either program missing, chromedriver not answering within 30 s, or the session refused.
    pub fn start(chromium: &Path, chromedriver: &Path) -> Result<Browser, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "{}: {e} (apt-get install chromium chromium-driver)",
                    chromedriver.display()
                )
            })?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(900)))
            .build()
            .into();
        let profile = TempDir(
            std::env::temp_dir().join(format!("burn-gguf-chromium-{}-{port}", std::process::id())),
        );
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            agent,
            _profile: profile,
        };
        let t0 = Instant::now();
        while browser.request("GET", "/status", None).is_err() {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err("chromedriver did not answer within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", browser._profile.0.display()));
        let caps = json!({
            "capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": chromium, "args": args},
                "goog:loggingPrefs": {"browser": "ALL"},
                "timeouts": {"script": 900_000, "pageLoad": 120_000},
            }}
        });
        let v = browser.request("POST", "/session", Some(caps))?;
        browser.session = v["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session id in {v}"))?
            .to_string();
        Ok(browser)
    }

    fn request(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let response = match method {
            "GET" => self.agent.get(&url).call(),
            "DELETE" => self.agent.delete(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.unwrap_or(json!({})).to_string()),
        };
        let mut response = response.map_err(|e| format!("{method} {path}: {e}"))?;
        let status = response.status();
        let text = response
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{method} {path}: {e}: {text}"))?;
        if !status.is_success() {
            return Err(format!(
                "{method} {path}: {status}: {}",
                v["value"]["message"].as_str().unwrap_or(&text)
            ));
        }
        Ok(v["value"].clone())
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Opens `url` (returns when the page has loaded; its scripts go on).
    pub fn goto(&self, url: &str) -> Result<(), String> {
        self.request(
            "POST",
            &self.session_path("/url"),
            Some(json!({"url": url})),
        )
        .map(|_| ())
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page and returns its value.
    pub fn execute(&self, script: &str, args: Value) -> Result<Value, String> {
        self.request(
            "POST",
            &self.session_path("/execute/sync"),
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Runs `script`, whose last argument is a callback, and returns the value it is called
    /// with (within the session's 900 s script timeout).
    pub fn execute_async(&self, script: &str, args: Value) -> Result<Value, String> {
        self.request(
            "POST",
            &self.session_path("/execute/async"),
            Some(json!({"script": script, "args": args})),
        )
    }

    /// The console messages logged since the last call, as their text (chromedriver's
    /// `url line:col "text"` form unwrapped).
    pub fn console(&self) -> Result<Vec<String>, String> {
        let v = self.request(
            "POST",
            &self.session_path("/se/log"),
            Some(json!({"type": "browser"})),
        )?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["message"].as_str())
            .map(console_text)
            .collect())
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Result<Vec<u8>, String> {
        let v = self.request("GET", &self.session_path("/screenshot"), None)?;
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().ok_or("no screenshot data")?)
            .map_err(|e| format!("screenshot: {e}"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.request("DELETE", &self.session_path(""), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The text of a console entry: chromedriver writes `SOURCE LINE:COL "TEXT"` with TEXT as a
/// JSON string when the message is one string.
fn console_text(message: &str) -> String {
    message
        .find(" \"")
        .and_then(|i| serde_json::from_str::<String>(&message[i + 1..]).ok())
        .unwrap_or_else(|| message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_entries_unwrap_to_their_text() {
        let m = r#"http://127.0.0.1:8000/main.js 190:10 "RESULT {\"a\":1}""#;
        assert_eq!(console_text(m), r#"RESULT {"a":1}"#);
        assert_eq!(console_text("plain"), "plain");
    }
}
