//! A static file server on 127.0.0.1 for the browser tests: GET and HEAD only, a thread per
//! connection, each URL prefix mapped to a folder, nothing outside those folders reachable.
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};

/// A running server; it stops with the process.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Server {
    /// Serves `mounts` (URL prefix ending in `/`, folder) on an ephemeral port of 127.0.0.1;
    /// the longest matching prefix wins.
    pub fn start(mut mounts: Vec<(String, PathBuf)>) -> std::io::Result<Server> {
        mounts.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mounts = mounts.clone();
                std::thread::spawn(move || {
                    let _ = respond(stream, &mounts);
                });
            }
        });
        Ok(Server { addr })
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

/// The file a request path names, if it lies inside a mount (no `..`, no absolute parts).
fn resolve(path: &str, mounts: &[(String, PathBuf)]) -> Option<PathBuf> {
    let path = path.split(['?', '#']).next()?;
    let path = if path.ends_with('/') {
        format!("{path}index.html")
    } else {
        path.to_string()
    };
    let (prefix, dir) = mounts.iter().find(|(p, _)| path.starts_with(p.as_str()))?;
    let rest = Path::new(&path[prefix.len()..]);
    if !rest.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(dir.join(rest)).filter(|p| p.is_file())
}

fn respond(stream: TcpStream, mounts: &[(String, PathBuf)]) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers: read and ignored.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut out = stream;
    let file = match method {
        "GET" | "HEAD" => resolve(path, mounts),
        _ => None,
    };
    let Some(file) = file else {
        let body = "not found\n";
        write!(
            out,
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )?;
        return Ok(());
    };
    let mut f = std::fs::File::open(&file)?;
    let len = f.metadata()?.len();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {len}\r\nCache-Control: no-store\r\n\
         Connection: close\r\n\r\n",
        content_type(&file)
    )?;
    if method == "GET" {
        std::io::copy(&mut f, &mut out)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_their_mounts() {
        let dir = std::env::temp_dir().join(format!("xtask-serve-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("index.html"), "x").unwrap();
        std::fs::write(dir.join("pkg/a.wasm"), "x").unwrap();
        let mounts = vec![("/".to_string(), dir.clone())];
        assert_eq!(resolve("/", &mounts), Some(dir.join("index.html")));
        assert_eq!(
            resolve("/pkg/a.wasm?x=1", &mounts),
            Some(dir.join("pkg/a.wasm"))
        );
        assert_eq!(resolve("/../etc/passwd", &mounts), None);
        assert_eq!(resolve("/pkg/../../x", &mounts), None);
        assert_eq!(resolve("/missing", &mounts), None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
