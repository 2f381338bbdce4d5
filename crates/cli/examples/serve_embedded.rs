//! The OpenAI-compatible server inside your own axum app: `Server::load` starts each model's
//! worker, `Server::router` gives the routes, mounted here under `/llm` next to the app's own.
//! The example then asks for a greedy completion over HTTP and prints it.
//!
//!     cargo run -p burn-gguf-cli --example serve_embedded -- [MODEL.gguf]
use axum::{Router, routing::get};
use burn_gguf_cli::serve::{ServeOptions, Server};
use std::io::{Read, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    burn_gguf_cli::host::use_private_runtime_dir(); // no Mesa warning without XDG_RUNTIME_DIR
    let model = std::env::args().nth(1);
    let mut opts = ServeOptions::default();
    opts.models = vec![model.unwrap_or("../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf".into())];
    let server = Server::load(&opts)?;
    let app = Router::new()
        .route("/", get(|| async { "my app" }))
        .nest("/llm", server.router());

    let runtime = tokio::runtime::Runtime::new()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    runtime.spawn(async move { axum::serve(listener, app).await });
    println!("serving; an OpenAI client's base_url would be http://{addr}/llm/v1");

    // A plain HTTP/1.1 request, to keep the example free of an HTTP client crate.
    let body = serde_json::json!({
        "model": server.model_ids()[0], "prompt": "Once upon a time",
        "max_tokens": 8, "temperature": 0,
    })
    .to_string();
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(
        stream,
        "POST /llm/v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, json) = response.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("the server answered {head}").into());
    }
    let reply: serde_json::Value = serde_json::from_str(json)?;
    println!("completion: {:?}", reply["choices"][0]["text"]);
    drop(runtime); // stops the listener; the router's handle on the models goes with it
    server.shutdown();
    Ok(())
}
