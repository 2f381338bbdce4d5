//! Structured outputs (`burn_gguf_models::structured`, llguidance): random walks through the
//! masks of real vocabularies (byte-level BPE: the tiny Qwen3 fixture; SentencePiece: the tiny
//! Llama fixture and Gemma 3 270M) always end in text that parses and satisfies its schema, and
//! bad grammars are refused with a reason. No device: masks are host values.
use burn_gguf_models::GgufTokenizer;
use burn_gguf_models::structured::{Grammar, GrammarCompiler, StructuredError};
use gguf::GgufFile;
use serde_json::{Value, json};

fn tokenizer(path: &std::path::Path) -> GgufTokenizer {
    GgufTokenizer::from_gguf(&GgufFile::open(path).expect("open fixture")).expect("tokenizer")
}

fn vocabularies() -> Vec<(&'static str, GgufTokenizer)> {
    let f = burn_gguf_tests::fixtures();
    vec![
        (
            "qwen3 (BPE)",
            tokenizer(&f.join("gguf/tiny-qwen3-Q8_0.gguf")),
        ),
        (
            "llama (SPM)",
            tokenizer(&f.join("arch/tiny-llama-Q8_0.gguf")),
        ),
        ("gemma3 (SPM)", tokenizer(&burn_gguf_tests::gemma_path())),
    ]
}

/// A small xorshift generator: the walks are reproducible.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Picks tokens uniformly among those allowed (a model that knows nothing, the hardest case
/// for termination) until the grammar is done or an end-of-generation token is drawn; returns
/// the decoded text of the tokens before the end.
fn walk(compiler: &GrammarCompiler, tok: &GgufTokenizer, grammar: &Grammar, seed: u64) -> String {
    let mut c = compiler.compile(grammar).expect("compiles");
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut ids = Vec::new();
    for _ in 0..2000 {
        let allowed: Vec<u32> = c
            .compute_allowed()
            .expect("mask")
            .iter()
            .enumerate()
            .filter_map(|(i, &ok)| ok.then_some(i as u32))
            .collect();
        let t = allowed[rng.below(allowed.len())];
        if tok.is_eog(t) {
            assert!(
                c.is_accepting(),
                "end of generation allowed before the grammar accepts"
            );
            return tok.decode(&ids).unwrap();
        }
        c.commit(t).expect("an allowed token commits");
        ids.push(t);
        if c.is_done() {
            return tok.decode(&ids).unwrap();
        }
    }
    panic!("no end after 2000 tokens: {:?}", tok.decode(&ids));
}

#[test]
fn random_walks_satisfy_the_schema_in_every_vocabulary() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "mood": {"enum": ["happy", "sad", "calm"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "mood", "tags"],
        "additionalProperties": false
    });
    for (label, tok) in vocabularies() {
        let compiler = GrammarCompiler::new(&tok, tok.vocab_size() + 7).expect("compiler");
        assert_eq!(compiler.n_vocab(), tok.vocab_size() + 7);
        for seed in 0..12 {
            let text = walk(&compiler, &tok, &Grammar::JsonSchema(schema.clone()), seed);
            let v: Value = serde_json::from_str(text.trim())
                .unwrap_or_else(|e| panic!("{label} seed {seed}: {e}: {text:?}"));
            let o = v.as_object().expect("an object");
            let name = o["name"].as_str().unwrap();
            assert!(
                name.len() >= 2
                    && name.len() <= 9
                    && name.chars().next().unwrap().is_ascii_uppercase()
                    && name.chars().skip(1).all(|c| c.is_ascii_lowercase()),
                "{label}: name {name:?}"
            );
            let age = o["age"].as_i64().unwrap();
            assert!((0..=120).contains(&age), "{label}: age {age}");
            assert!(["happy", "sad", "calm"].contains(&o["mood"].as_str().unwrap()));
            let tags = o["tags"].as_array().unwrap();
            assert!(tags.len() <= 3);
            assert!(
                tags.iter()
                    .all(|t| t.as_str().unwrap().chars().count() <= 6)
            );
            assert!(o.get("ok").is_none_or(Value::is_boolean));
            assert!(
                o.keys()
                    .all(|k| ["name", "age", "mood", "tags", "ok"].contains(&k.as_str()))
            );
        }
        // Any JSON object, and a regex.
        for seed in 0..4 {
            let text = walk(
                &compiler,
                &tok,
                &Grammar::Regex("(yes|no), [0-9]{2}".into()),
                seed,
            );
            let t = text.trim_start();
            assert!(
                t.starts_with("yes, ") || t.starts_with("no, "),
                "{label}: {text:?}"
            );
            let digits: String = text.chars().filter(char::is_ascii_digit).collect();
            assert_eq!(digits.len(), 2, "{label}: {text:?}");
        }
    }
}

#[test]
fn json_object_mode_ends_in_an_object() {
    let tok = tokenizer(&burn_gguf_tests::fixtures().join("gguf/tiny-qwen3-Q8_0.gguf"));
    let compiler = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
    // A uniform walk over any JSON can nest deeply; a bounded one is enough to check the mode.
    let mut ended = 0;
    for seed in 0..8 {
        let mut c = compiler.compile(&Grammar::JsonObject).unwrap();
        let mut rng = Rng(seed * 7919 + 1);
        let mut ids = Vec::new();
        for _ in 0..300 {
            let allowed: Vec<u32> = (c.compute_allowed().unwrap().iter().enumerate())
                .filter_map(|(i, &ok)| ok.then_some(i as u32))
                .collect();
            // Prefer closing once the text is long: EOS or a closing token when allowed.
            let closing: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|&t| {
                    tok.is_eog(t)
                        || tok
                            .decode(&[t])
                            .unwrap()
                            .trim()
                            .starts_with(['}', ']', '"'])
                })
                .collect();
            let pool = if ids.len() > 40 && !closing.is_empty() {
                &closing
            } else {
                &allowed
            };
            let t = pool[rng.below(pool.len())];
            if tok.is_eog(t) {
                break;
            }
            c.commit(t).unwrap();
            ids.push(t);
            if c.is_done() {
                break;
            }
        }
        let text = tok.decode(&ids).unwrap();
        if c.is_accepting() || c.is_done() {
            let v: Value =
                serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(v.is_object(), "{text:?}");
            ended += 1;
        }
    }
    assert!(ended >= 4, "only {ended} of 8 walks closed their object");
}

#[test]
fn masks_hide_control_tokens_and_refuse_disallowed_commits() {
    let tok = tokenizer(&burn_gguf_tests::gemma_path());
    let compiler = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
    let mut c = compiler.compile(&Grammar::Regex("[a-z]+".into())).unwrap();
    let allowed = c.compute_allowed().unwrap();
    let start = tok.token_to_id("<start_of_turn>").unwrap();
    assert!(tok.is_control(start));
    assert!(
        !allowed[start as usize],
        "a control token is never grammar text"
    );
    let end = tok.token_to_id("<end_of_turn>").unwrap();
    assert!(!allowed[end as usize], "nothing matched yet: no end");
    let upper = tok.token_to_id("A").unwrap();
    assert!(!allowed[upper as usize]);
    assert!(matches!(c.commit(upper), Err(StructuredError::Step(_))));

    let mut c = compiler.compile(&Grammar::Regex("[a-z]+".into())).unwrap();
    let lower = tok.token_to_id("abc").unwrap();
    c.commit(lower).unwrap();
    let allowed = c.compute_allowed().unwrap();
    assert!(
        allowed[end as usize],
        "after a match the end of turn is allowed"
    );
    let bias = c.compute_bias().unwrap();
    assert_eq!(bias.len(), tok.vocab_size());
    assert_eq!(bias[end as usize], 0.0);
    assert_eq!(bias[upper as usize], f32::NEG_INFINITY);
}

#[test]
fn bad_grammars_are_refused_with_a_reason() {
    let tok = tokenizer(&burn_gguf_tests::fixtures().join("gguf/tiny-qwen3-Q8_0.gguf"));
    let compiler = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
    let err = |g: Grammar| match compiler.compile(&g) {
        Err(StructuredError::Compile(m)) => m,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("{g:?} compiled"),
    };
    assert!(err(Grammar::JsonSchema(json!(true))).contains("must be an object"));
    assert!(err(Grammar::JsonSchema(json!([1]))).contains("must be an object"));
    let m = err(Grammar::JsonSchema(
        json!({"type": "string", "pattern": "(unclosed"}),
    ));
    assert!(!m.is_empty());
    let m = err(Grammar::JsonSchema(json!({"type": "frobnicate"})));
    assert!(!m.is_empty());
    let m = err(Grammar::JsonSchema(json!({"$ref": "#/$defs/missing"})));
    assert!(!m.is_empty());
    let m = err(Grammar::JsonSchema(
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ));
    assert!(!m.is_empty());
    let m = err(Grammar::Lark("start: foo".into()));
    assert!(!m.is_empty());
    let big = "a".repeat(burn_gguf_models::structured::MAX_GRAMMAR_BYTES + 1);
    assert!(err(Grammar::Regex(big)).contains("at most"));
}

#[test]
fn forced_tool_calls_parse_and_fit_their_parameters() {
    use burn_gguf_models::tool_calls::{Tool, ToolCallFormat};
    let tools = vec![
        Tool {
            name: "add".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a", "b"], "additionalProperties": false}),
        },
        Tool {
            name: "get_weather".into(),
            description: Some("Weather".into()),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 10}},
                "required": ["city"], "additionalProperties": false}),
        },
    ];
    for (label, tok) in vocabularies() {
        let compiler = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
        for format in [
            ToolCallFormat::Hermes,
            ToolCallFormat::Llama3,
            ToolCallFormat::QwenXml,
        ] {
            let grammar = format.grammar(&tools, |t| tok.token_to_id(t)).unwrap();
            for seed in 0..6 {
                let text = walk(&compiler, &tok, &grammar, seed);
                let (content, calls) = format.parse(&text, &tools);
                assert_eq!(calls.len(), 1, "{label} {format:?}: {text:?}");
                assert_eq!(content, None, "{label} {format:?}: {text:?}");
                let c = &calls[0];
                match c.name.as_str() {
                    "add" => {
                        for k in ["a", "b"] {
                            let v = c.arguments[k].as_i64().unwrap();
                            assert!((0..=99).contains(&v), "{text:?}");
                        }
                    }
                    "get_weather" => {
                        assert!(c.arguments["city"].as_str().unwrap().chars().count() <= 10)
                    }
                    other => panic!("{label}: call of {other}: {text:?}"),
                }
            }
        }
        // Mistral's marker is a control token these vocabularies lack.
        let e = ToolCallFormat::Mistral.grammar(&tools, |t| tok.token_to_id(t));
        assert!(e.unwrap_err().contains("[TOOL_CALLS]"));
    }
}

#[test]
fn digit_runs_end_even_when_the_model_wants_more() {
    // A model that always writes another digit when it may (Gemma 3 270M at temperature 1 wrote
    // `100.000...` until max_tokens under "maximum": 100): the number still ends.
    let schema = json!({"type": "object", "properties": {
        "w": {"type": "number", "minimum": 0, "maximum": 100},
        "n": {"type": "number"}},
        "required": ["w", "n"], "additionalProperties": false});
    let max = burn_gguf_models::structured::MAX_DIGIT_RUN;
    for (label, tok) in vocabularies() {
        let compiler = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
        let mut c = compiler
            .compile(&Grammar::JsonSchema(schema.clone()))
            .unwrap();
        let mut ids = Vec::new();
        for step in 0.. {
            assert!(step < 400, "{label}: no end: {:?}", tok.decode(&ids));
            let allowed: Vec<u32> = (c.compute_allowed().unwrap().iter().enumerate())
                .filter_map(|(i, &ok)| ok.then_some(i as u32))
                .collect();
            let text = |t: u32| tok.decode(&[t]).unwrap();
            // Prefer a digit, then the key order's next structural token, never the end early.
            let t = allowed
                .iter()
                .copied()
                .find(|&t| text(t).starts_with(|ch: char| ch.is_ascii_digit()))
                .or_else(|| allowed.iter().copied().find(|&t| !tok.is_eog(t)))
                .unwrap_or(allowed[0]);
            if tok.is_eog(t) {
                break;
            }
            c.commit(t).unwrap();
            ids.push(t);
            if c.is_done() {
                break;
            }
        }
        let text = tok.decode(&ids).unwrap();
        let v: Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{label}: {e}: {text:?}"));
        let w = v["w"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&w), "{label}: {text:?}");
        let longest = text
            .split(|ch: char| !ch.is_ascii_digit())
            .map(str::len)
            .max()
            .unwrap_or(0);
        assert!(
            longest <= max,
            "{label}: a run of {longest} digits: {text:?}"
        );
    }
}
