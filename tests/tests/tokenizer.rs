//! Tokenizer from GGUF metadata against llama.cpp: the `tokenizer_vectors.json` fixture (llama.cpp
//! `llama_tokenize(parse_special = true)` ids) for the real Gemma 3 270M vocabulary (SPM) and the
//! tiny Qwen3 one (byte-level BPE), plus the metadata validation cases C06, C23 and C24; and ids
//! from llama.cpp's `llama-tokenize` for the real Llama 3 vocabulary (`llama-bpe`, its
//! `ignore_merges` rule, SERVING-CASES N01) and Gemma 3's whitespace runs; `generate` never
//! streams part of a character (N03).
//!
//! The Gemma tests read `$BURN_GGUF_GEMMA`, else the model cache (fetched on first use); the
//! Llama 3 test reads Meta's tokenizer file from the cache (`cargo xtask fetch-model
//! llama3-tokenizer`, fetched on first use).

use std::time::Instant;

use burn_gguf_models::tokenizer::{GgufTokenizer, TokenizerError, VocabType, pre_tokenize};
use burn_gguf_tests::{fixtures, json_ids, read_json};
use gguf::{GgufFile, GgufWriter, MetadataArray, MetadataValue};

/// The real Gemma file (`$BURN_GGUF_GEMMA`, else the cache, fetched on first use).
fn gemma_file() -> GgufFile {
    let p = burn_gguf_tests::gemma_path();
    GgufFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `(text, ids with add_special, ids without)` of one model's vectors.
fn vectors(model: &str) -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let v = read_json("tokenizer/tokenizer_vectors.json");
    let cases = v[model]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("no vectors for {model}"));
    assert!(!cases.is_empty());
    cases
        .iter()
        .map(|c| {
            (
                c["text"].as_str().expect("text").to_string(),
                json_ids(&c["ids_add_special"]),
                json_ids(&c["ids_no_add_special"]),
            )
        })
        .collect()
}

/// Checks every vector: ids with and without `add_special`, and that decoding gives the text back
/// (control tokens render as nothing in `decode`, as their text with `unparse_special`).
fn check_vectors(tok: &GgufTokenizer, model: &str) {
    let mut failures = Vec::new();
    for (text, with, without) in vectors(model) {
        let got_with = tok.encode(&text, true).unwrap();
        let got_without = tok.encode(&text, false).unwrap();
        if got_with != with {
            failures.push(format!(
                "{text:?} add_special:\n  got  {got_with:?}\n  want {with:?}"
            ));
        }
        if got_without != without {
            failures.push(format!(
                "{text:?}:\n  got  {got_without:?}\n  want {without:?}"
            ));
        }
        let has_control = without.iter().any(|&id| tok.is_control(id));
        let decoded = tok.decode(&without).unwrap();
        if !has_control && decoded != text {
            failures.push(format!("decode {text:?} gave {decoded:?}"));
        }
        let unparsed = tok.decode_with(&without, true).unwrap();
        if unparsed != text {
            failures.push(format!(
                "decode_with(unparse_special) {text:?} gave {unparsed:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn gemma_vectors_match_llama_cpp() {
    let file = gemma_file();
    let t0 = Instant::now();
    let tok = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    eprintln!(
        "Gemma tokenizer ({} tokens) built in {:?}",
        tok.vocab_size(),
        t0.elapsed()
    );
    assert_eq!(tok.vocab_type(), VocabType::Spm);
    assert_eq!(tok.vocab_size(), 262144);
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.eot_id()),
        (Some(2), Some(1), Some(106))
    );
    assert!(tok.add_bos() && !tok.add_eos());
    check_vectors(&tok, "gemma3_270m_spm");

    // Control tokens render as nothing in decode, as their text in token_to_piece.
    let chat = tok
        .encode("<start_of_turn>user\nhi<end_of_turn>\n", false)
        .unwrap();
    assert_eq!(tok.decode(&chat).unwrap(), "user\nhi\n");
    assert_eq!(tok.token_to_piece(105).unwrap(), "<start_of_turn>");
    assert_eq!(tok.decode(&[2, 818, 5279]).unwrap(), "The capital");
    assert!(tok.decode(&[262144]).is_err());

    // End of generation: <eos>, <end_of_turn>; not </s> (212, an HTML tag in Gemma's vocabulary).
    assert!(tok.is_eog(1) && tok.is_eog(106));
    assert!(!tok.is_eog(2) && !tok.is_eog(212) && !tok.is_eog(818));
}

#[test]
fn gemma_greedy_output_decodes_like_llama_cpp() {
    let file = gemma_file();
    let tok = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    let run = read_json("gemma/gemma3_270m_capital_kvf32.json");
    assert_eq!(
        tok.encode(run["prompt_text"].as_str().unwrap(), true)
            .unwrap(),
        json_ids(&run["prompt_ids"])
    );
    let greedy = json_ids(&run["greedy_ids"]);
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    assert_eq!(
        tok.decode_bytes(&greedy).unwrap(),
        hex(run["greedy_text_hex"].as_str().unwrap())
    );
    let pieces: Vec<Vec<u8>> = run["greedy_pieces_hex"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| hex(p.as_str().unwrap()))
        .collect();
    assert_eq!(pieces.len(), greedy.len());
    for (&id, want) in greedy.iter().zip(&pieces) {
        assert_eq!(&tok.token_bytes(id, false).unwrap(), want, "piece of {id}");
    }
}

#[test]
fn gemma_c24_prompt_starting_with_bos_gets_one_bos() {
    let file = gemma_file();
    let tok = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    let rendered = "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n";
    // llama.cpp's tokenize keeps both (and warns); encode_prompt sends exactly one.
    assert_eq!(&tok.encode(rendered, true).unwrap()[..3], &[2, 2, 105]);
    let ids = tok.encode_prompt(rendered).unwrap();
    assert_eq!(&ids[..2], &[2, 105]);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 1);
    assert_eq!(
        tok.encode_prompt("<start_of_turn>user\n").unwrap()[..2],
        [2, 105]
    );
}

#[test]
fn tiny_qwen3_bpe_vectors_match_llama_cpp() {
    let file = GgufFile::open(fixtures().join("gguf/tiny-qwen3-f16.gguf")).expect("tiny qwen3");
    let tok = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    assert_eq!(tok.vocab_type(), VocabType::Bpe);
    assert!(!tok.add_bos());
    check_vectors(&tok, "tiny_qwen3_gpt2_bpe");
    // <|im_end|> is end of generation (found by its text) and renders as nothing.
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(tok.is_eog(im_end));
    assert_eq!(
        tok.decode(&tok.encode("hi<|im_end|>", false).unwrap())
            .unwrap(),
        "hi"
    );
}

/// A GGUF holding only the given metadata, read back.
fn gguf_with(kv: Vec<(&str, MetadataValue)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in kv {
        w.add_metadata(k, v);
    }
    GgufFile::from_bytes(w.to_bytes().expect("write")).expect("read back")
}

fn strings(v: &[&str]) -> MetadataValue {
    MetadataValue::Array(MetadataArray::String(
        v.iter().map(|s| s.to_string()).collect(),
    ))
}

const EIGHT: [&str; 8] = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab"];

/// The C06 file: 8 tokens, with `scores` and `token_type` as given.
fn c06_file(scores: MetadataValue, types: MetadataValue) -> GgufFile {
    gguf_with(vec![
        (
            "tokenizer.ggml.model",
            MetadataValue::String("llama".into()),
        ),
        ("tokenizer.ggml.tokens", strings(&EIGHT)),
        ("tokenizer.ggml.scores", scores),
        ("tokenizer.ggml.token_type", types),
    ])
}

fn err(file: &GgufFile) -> String {
    GgufTokenizer::from_gguf(file)
        .expect_err("must be rejected")
        .to_string()
}

#[test]
fn c06_array_element_types_and_lengths_are_checked() {
    let types = || MetadataValue::Array(MetadataArray::I32(vec![2, 3, 3, 1, 1, 1, 1, 1]));
    let scores = || MetadataValue::Array(MetadataArray::F32((0..8).map(|i| -(i as f32)).collect()));

    // The minimal failing input: scores as ARRAY[UINT8] with the right count.
    let e = err(&c06_file(
        MetadataValue::Array(MetadataArray::U8(vec![0; 8])),
        types(),
    ));
    assert!(
        e.contains("tokenizer.ggml.scores") && e.contains("must be an array of FLOAT32"),
        "{e}"
    );
    assert!(e.contains("ARRAY[UINT8]"), "{e}");

    // token_type must be INT32.
    let e = err(&c06_file(
        scores(),
        MetadataValue::Array(MetadataArray::U8(vec![1; 8])),
    ));
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("INT32"),
        "{e}"
    );
    let e = err(&c06_file(
        scores(),
        MetadataValue::Array(MetadataArray::F32(vec![1.0; 8])),
    ));
    assert!(e.contains("tokenizer.ggml.token_type"), "{e}");

    // Lengths must match the tokens.
    let short = MetadataValue::Array(MetadataArray::F32(vec![0.0; 7]));
    let e = GgufTokenizer::from_gguf(&c06_file(short, types())).unwrap_err();
    assert!(
        matches!(
            e,
            TokenizerError::LengthMismatch {
                len: 7,
                n_tokens: 8,
                ..
            }
        ),
        "{e}"
    );
    let long = MetadataValue::Array(MetadataArray::I32(vec![1; 9]));
    let e = err(&c06_file(scores(), long));
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains('9') && e.contains('8'),
        "{e}"
    );

    // The well-formed file builds and tokenizes.
    let tok = GgufTokenizer::from_gguf(&c06_file(scores(), types())).expect("valid");
    assert_eq!(tok.vocab_size(), 8);
    assert_eq!(tok.encode("ab", true).unwrap(), vec![1, 6, 5]);

    // merges must be ARRAY[STRING] for gpt2.
    let f = gguf_with(vec![
        ("tokenizer.ggml.model", MetadataValue::String("gpt2".into())),
        ("tokenizer.ggml.pre", MetadataValue::String("qwen2".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b", "ab"])),
        (
            "tokenizer.ggml.merges",
            MetadataValue::Array(MetadataArray::U8(vec![0; 1])),
        ),
    ]);
    let e = err(&f);
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("STRING"),
        "{e}"
    );

    // Other metadata errors name their key.
    let f = gguf_with(vec![
        (
            "tokenizer.ggml.model",
            MetadataValue::String("llama".into()),
        ),
        ("tokenizer.ggml.tokens", strings(&EIGHT)),
        ("tokenizer.ggml.eos_token_id", MetadataValue::U32(8)),
    ]);
    let e = err(&f);
    assert!(
        e.contains("tokenizer.ggml.eos_token_id") && e.contains("out of range"),
        "{e}"
    );
    let f = gguf_with(vec![
        ("tokenizer.ggml.model", MetadataValue::String("rwkv".into())),
        ("tokenizer.ggml.tokens", strings(&EIGHT)),
    ]);
    assert!(matches!(
        GgufTokenizer::from_gguf(&f),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    let f = gguf_with(vec![(
        "tokenizer.ggml.model",
        MetadataValue::String("llama".into()),
    )]);
    assert!(err(&f).contains("tokenizer.ggml.tokens"));
    let f = gguf_with(vec![
        (
            "tokenizer.ggml.model",
            MetadataValue::String("llama".into()),
        ),
        ("tokenizer.ggml.tokens", strings(&["a", "b", "a"])),
    ]);
    assert!(matches!(
        GgufTokenizer::from_gguf(&f),
        Err(TokenizerError::DuplicateToken {
            first: 0,
            second: 2,
            ..
        })
    ));
}

#[test]
fn c23_pre_tokenizer_regex_follows_pre() {
    let p = |pre: &str, s: &str| pre_tokenize(pre, s).unwrap();
    assert_eq!(p("gpt2", "x 12345"), ["x", " 12345"]);
    assert_eq!(p("llama-bpe", "x 12345"), ["x", " ", "123", "45"]);
    assert_eq!(p("qwen2", "x 12345"), ["x", " ", "1", "2", "3", "4", "5"]);
    for pre in ["gpt2", "llama-bpe", "qwen2"] {
        assert_eq!(p(pre, "->"), ["->"], "{pre}");
    }
    // An unknown name is an error, not a silent fallback.
    let f = gguf_with(vec![
        ("tokenizer.ggml.model", MetadataValue::String("gpt2".into())),
        (
            "tokenizer.ggml.pre",
            MetadataValue::String("no-such-pre".into()),
        ),
        ("tokenizer.ggml.tokens", strings(&["a", "b", "ab"])),
        ("tokenizer.ggml.merges", strings(&["a b"])),
    ]);
    let e = GgufTokenizer::from_gguf(&f).unwrap_err();
    assert!(
        matches!(e, TokenizerError::UnsupportedPre(ref p) if p == "no-such-pre"),
        "{e}"
    );
}

#[test]
fn c24_llama3_style_template_gets_one_bos_and_whole_special_tokens() {
    // A byte-level vocabulary with Llama 3's special tokens (ids shifted: BOS is 256 here).
    let mut tokens: Vec<String> = (0..=255u8).map(byte_char).collect();
    let specials = [
        "<|begin_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ];
    tokens.extend(specials.iter().map(|s| s.to_string()));
    let mut types = vec![1i32; 256];
    types.extend([3; 4]);
    let f = gguf_with(vec![
        ("tokenizer.ggml.model", MetadataValue::String("gpt2".into())),
        (
            "tokenizer.ggml.pre",
            MetadataValue::String("llama-bpe".into()),
        ),
        (
            "tokenizer.ggml.tokens",
            MetadataValue::Array(MetadataArray::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type",
            MetadataValue::Array(MetadataArray::I32(types)),
        ),
        (
            "tokenizer.ggml.merges",
            MetadataValue::Array(MetadataArray::String(Vec::new())),
        ),
        ("tokenizer.ggml.bos_token_id", MetadataValue::U32(256)),
        ("tokenizer.ggml.eos_token_id", MetadataValue::U32(259)),
        ("tokenizer.ggml.add_bos_token", MetadataValue::Bool(true)),
    ]);
    let tok = GgufTokenizer::from_gguf(&f).expect("tokenizer");
    // `{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}`
    let rendered = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
    let ids = tok.encode_prompt(rendered).unwrap();
    assert_eq!(&ids[..2], &[256, 257]);
    assert_eq!(ids.iter().filter(|&&id| id == 256).count(), 1);
    assert!(ids.contains(&258) && ids.ends_with(&[259]));
    assert!(tok.is_eog(259));
    assert_eq!(tok.decode(&ids).unwrap(), "user\n\nhi");
}

/// GPT-2's byte-to-unicode character for a byte.
fn byte_char(b: u8) -> String {
    let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable {
        return char::from(b).to_string();
    }
    let n = (0..b)
        .filter(|&x| !matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF))
        .count() as u32;
    char::from_u32(256 + n).unwrap().to_string()
}

/// `(text, ids with add_special, ids without)` from llama.cpp's `llama-tokenize` (the tree in
/// `llama-cpp-python` 0.3.36, `-f FILE --no-escape --ids [--no-bos]`) on the real Llama 3
/// vocabulary built by [`burn_gguf_tests::llama3_vocab_gguf`] and written with gguf-py; the
/// ids without BOS agree with Meta's tiktoken encoder. `" Việt"` is one token
/// (`ignore_merges`: a pre-token that is a whole vocabulary entry is not merged up from bytes,
/// which would give three).
const LLAMA3_VECTORS: &[(&str, &[u32], &[u32])] = &[
    (" Việt", &[128000, 101798], &[101798]),
    (
        "Xin chào Việt Nam",
        &[128000, 55, 258, 523, 100988, 101798, 31074],
        &[55, 258, 523, 100988, 101798, 31074],
    ),
    ("Hello world", &[128000, 9906, 1917], &[9906, 1917]),
    (
        "I'm here, you're there, it's fine, we'll see, they'd go",
        &[
            128000, 40, 2846, 1618, 11, 499, 2351, 1070, 11, 433, 596, 7060, 11, 584, 3358, 1518,
            11, 814, 4265, 733,
        ],
        &[
            40, 2846, 1618, 11, 499, 2351, 1070, 11, 433, 596, 7060, 11, 584, 3358, 1518, 11, 814,
            4265, 733,
        ],
    ),
    (
        "  multiple   spaces\n\n\nand\t\ttabs  ",
        &[
            128000, 220, 5361, 256, 12908, 1432, 438, 197, 3324, 3518, 256,
        ],
        &[220, 5361, 256, 12908, 1432, 438, 197, 3324, 3518, 256],
    ),
    (
        "1234567 3.14159 2024-06-01",
        &[
            128000, 4513, 10961, 22, 220, 18, 13, 9335, 2946, 220, 2366, 19, 12, 2705, 12, 1721,
        ],
        &[
            4513, 10961, 22, 220, 18, 13, 9335, 2946, 220, 2366, 19, 12, 2705, 12, 1721,
        ],
    ),
    (
        "emoji 😀 and café naïve 日本語 한국어",
        &[
            128000, 38623, 91416, 323, 53050, 95980, 588, 105180, 102158, 104008, 32179,
        ],
        &[
            38623, 91416, 323, 53050, 95980, 588, 105180, 102158, 104008, 32179,
        ],
    ),
    (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        &[128000, 128000, 128006, 882, 128007, 271, 6151, 128009],
        &[128000, 128006, 882, 128007, 271, 6151, 128009],
    ),
    (
        "    def main():\n        return 0\n",
        &[128000, 262, 711, 1925, 4019, 286, 471, 220, 15, 198],
        &[262, 711, 1925, 4019, 286, 471, 220, 15, 198],
    ),
    (
        " indivisible antidisestablishmentarianism",
        &[128000, 3687, 23936, 3276, 85342, 34500, 479, 8997, 2191],
        &[3687, 23936, 3276, 85342, 34500, 479, 8997, 2191],
    ),
    ("", &[128000], &[]),
    (" ", &[128000, 220], &[220]),
    // SERVING-CASES N01's other words (rten #453), and N03's `歪`, whose bytes E6 AD AA are two
    // tokens (15722 holds E6 AD).
    (" Việc", &[128000, 114195], &[114195]),
    (" soubor", &[128000, 127539], &[127539]),
    (" sektör", &[128000, 108921], &[108921]),
    (
        "歪歪歪 🦙",
        &[128000, 15722, 103, 15722, 103, 15722, 103, 11410, 99, 247],
        &[15722, 103, 15722, 103, 15722, 103, 11410, 99, 247],
    ),
];

/// The same for Gemma 3 270M's SentencePiece vocabulary: runs of spaces, tabs and newlines
/// (Gemma has a token for each run length up to 31 spaces).
const GEMMA3_VECTORS: &[(&str, &[u32], &[u32])] = &[
    ("a  b", &[2, 236746, 138, 236763], &[236746, 138, 236763]),
    ("a   b", &[2, 236746, 139, 236763], &[236746, 139, 236763]),
    ("a    b", &[2, 236746, 140, 236763], &[236746, 140, 236763]),
    ("\n\n\n", &[2, 109], &[109]),
    ("  ", &[2, 138], &[138]),
    ("   ", &[2, 139], &[139]),
    (
        "    indented line",
        &[2, 140, 724, 16764, 1757],
        &[140, 724, 16764, 1757],
    ),
    ("\t\tx", &[2, 255969, 236781], &[255969, 236781]),
    (
        "x \n y",
        &[2, 236781, 236743, 107, 570],
        &[236781, 236743, 107, 570],
    ),
    ("trailing   ", &[2, 136697, 139], &[136697, 139]),
    (
        "mixed \t \n  runs",
        &[2, 63258, 236743, 255968, 236743, 107, 138, 85817],
        &[63258, 236743, 255968, 236743, 107, 138, 85817],
    ),
    (
        "           eleven spaces",
        &[2, 147, 7159, 1504, 9952],
        &[147, 7159, 1504, 9952],
    ),
    (
        "line\r\nwindows",
        &[2, 1257, 251, 107, 33908],
        &[1257, 251, 107, 33908],
    ),
];

/// Checks `vectors` against `tok`: ids with and without `add_special`.
fn check_llama_cpp_ids(tok: &GgufTokenizer, what: &str, vectors: &[(&str, &[u32], &[u32])]) {
    let mut failures = Vec::new();
    for &(text, with, without) in vectors {
        for (add_special, want) in [(true, with), (false, without)] {
            let got = tok.encode(text, add_special).unwrap();
            if got != want {
                failures.push(format!(
                    "{text:?} (add_special {add_special}):\n  got  {got:?}\n  want {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{what}:\n{}", failures.join("\n"));
}

/// Llama 3's byte-level BPE (`pre` `llama-bpe`) on its real 128,256-token vocabulary.
#[test]
fn llama3_vocabulary_matches_llama_cpp() {
    let path = burn_gguf_cli::fetch::ensure_model("llama3-tokenizer")
        .unwrap_or_else(|e| panic!("Llama 3 tokenizer: {e}"));
    let file = burn_gguf_tests::llama3_vocab_gguf(&path);
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.vocab_size(), 128_256);
    assert_eq!(tok.vocab_type(), VocabType::Bpe);
    check_llama_cpp_ids(&tok, "llama3", LLAMA3_VECTORS);
    // `<|eot_id|>` and `<|eom_id|>` end generation as well as EOS.
    for id in [128_001, 128_008, 128_009] {
        assert!(tok.is_eog(id), "{id}");
    }
    assert_eq!(
        tok.decode(&tok.encode(" Việt", false).unwrap()).unwrap(),
        " Việt"
    );
    // N03: a token holding part of a character decodes to its bytes, and to a replacement
    // character as text, which `generate` and `serve` hold back until the next token completes it.
    assert_eq!(tok.decode_bytes(&[15722]).unwrap(), [0xE6, 0xAD]);
    assert!(tok.decode(&[15722]).unwrap().ends_with('\u{FFFD}'));
    assert_eq!(tok.decode(&[15722, 103]).unwrap(), "歪");
}

/// Gemma 3's whitespace runs.
#[test]
fn gemma_whitespace_runs_match_llama_cpp() {
    let tok = GgufTokenizer::from_gguf(&gemma_file()).unwrap();
    check_llama_cpp_ids(&tok, "gemma3", GEMMA3_VECTORS);
}

/// A model that "predicts" the tokens of a script, one per step, whatever the input: logits
/// `[1, vocab]` with the script's next token at 1 and the rest at 0.
struct Scripted {
    script: Vec<u32>,
    vocab: usize,
}

impl burn_gguf_models::CausalLm for Scripted {
    /// Tokens fed so far.
    type Cache = usize;
    fn new_cache(&self) -> usize {
        0
    }
    fn forward(
        &self,
        ids: &[u32],
        fed: &mut usize,
        _all_logits: bool,
    ) -> Result<burn::tensor::Tensor<2>, burn_gguf_models::Error> {
        // The prompt's tokens are fed first; each later call is one generated token.
        let step = (*fed).saturating_sub(PROMPT_LEN - 1);
        *fed += ids.len();
        let mut row = vec![0f32; self.vocab];
        row[self.script[step.min(self.script.len() - 1)] as usize] = 1.0;
        let device = burn::tensor::Device::flex();
        Ok(burn::tensor::Tensor::from_data(
            burn::tensor::TensorData::new(row, [1, self.vocab]),
            &device,
        ))
    }
    fn truncate_cache(&self, fed: &mut usize, len: usize) -> usize {
        *fed = len.min(*fed);
        *fed
    }
}

/// Tokens of the prompt [`Scripted`] is given (`<|begin_of_text|>` and "hi").
const PROMPT_LEN: usize = 2;

/// SERVING-CASES N03 through `generate`: with Llama 3's vocabulary, `歪` is two tokens (15722
/// holds bytes E6 AD, 103 holds AA) and `🦙` three; `on_text` gets each character whole, never
/// a replacement character, and generation stops at `<|eot_id|>` without its text.
#[test]
fn streamed_text_never_splits_a_character() {
    use burn_gguf_models::{Sampler, SamplerConfig, generate};
    let path = burn_gguf_cli::fetch::ensure_model("llama3-tokenizer")
        .unwrap_or_else(|e| panic!("Llama 3 tokenizer: {e}"));
    let tok = GgufTokenizer::from_gguf(&burn_gguf_tests::llama3_vocab_gguf(&path)).unwrap();
    assert_eq!(tok.encode("hi", true).unwrap().len(), PROMPT_LEN);
    let model = Scripted {
        script: vec![15722, 103, 15722, 103, 11410, 99, 247, 128_009],
        vocab: tok.vocab_size(),
    };
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    });
    let mut pieces = Vec::new();
    let out = generate(&model, &tok, "hi", 32, &mut sampler, |p| {
        pieces.push(p.to_string())
    })
    .unwrap();
    assert_eq!(out.generated_ids, model.script);
    assert_eq!(pieces, ["歪", "歪", " 🦙"]);
    assert_eq!(out.text, "歪歪 🦙");
}
