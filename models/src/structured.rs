//! Structured outputs: generated text kept inside a JSON schema, a regular expression or a Lark
//! grammar by a mask over the vocabulary at every step, computed by
//! [llguidance](https://github.com/guidance-ai/llguidance) (the engine llama.cpp's
//! `--grammar`/`--json-schema` path and mistral.rs use).
//!
//! A [`GrammarCompiler`] is built once per vocabulary (the tokenizer's tokens as bytes in a
//! token trie); it compiles a [`Grammar`] into a [`TokenConstraint`], one per sequence. Each
//! step: [`TokenConstraint::compute_bias`] gives the additive mask (`0` allowed, `-inf` not) for
//! the logits before sampling, [`TokenConstraint::commit`] takes the sampled token.
//!
//! The vocabulary bridge covers both of GGUF's vocabulary kinds: a SentencePiece piece's `▁`
//! is a space and `<0x0A>` its byte; a byte-level BPE token is the bytes its characters stand
//! for ([`GgufTokenizer::token_bytes`]). Control tokens (`<start_of_turn>`, `<|im_end|>`) are
//! marked special (llguidance's `0xFF` prefix), so no grammar text produces them; the
//! end-of-generation tokens end a sequence once the grammar accepts.
//!
//! JSON whitespace between tokens is bounded by default (a space, or a newline and up to 20
//! spaces or tabs of indent, as llama.cpp's `json-schema-to-grammar` allows): a model that
//! emits whitespace forever cannot keep a JSON answer open. A schema may set llguidance's own
//! options in an `x-guidance` key. So are runs of digits in JSON grammars: llguidance's number
//! lexeme has no length limit (`100.000...` stays within `"maximum": 100` forever), so once a
//! run of [`MAX_DIGIT_RUN`] digits is written, a token that would extend it is masked out
//! wherever the grammar allows anything else (llama.cpp's grammar bounds a number's integral
//! and decimal parts to 16 digits each; an f64 holds about 16).

use std::sync::Arc;

use burn::tensor::{Tensor, TensorData};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};

use crate::GgufTokenizer;

/// Largest grammar source accepted, in bytes (a JSON schema serialized, a regex, a Lark text).
pub const MAX_GRAMMAR_BYTES: usize = 256 << 10;

/// Longest run of digits a JSON grammar's sequence may write where the grammar allows something
/// else (a number's integral or decimal part).
pub const MAX_DIGIT_RUN: usize = 16;

/// JSON whitespace between tokens: one space, or a newline and up to 20 spaces or tabs (a
/// regex, llguidance's `whitespace_pattern`).
pub const JSON_WHITESPACE: &str = r"\x20|\x0A[\x20\x09]{0,20}";

/// A grammar the generated text must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid under this JSON schema (draft 2020-12 subset llguidance supports:
    /// objects, arrays, enums, `const`, `anyOf`/`oneOf`, `$ref`, numeric bounds, string
    /// `pattern`, `minLength`/`maxLength`, `format`); must be a JSON object.
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression (whole).
    Regex(String),
    /// Text of this Lark grammar (llguidance's dialect: `start:` rule, `%json` allowed).
    Lark(String),
}

/// Errors of structured outputs.
#[derive(Debug, thiserror::Error)]
pub enum StructuredError {
    /// The grammar or schema does not compile (the reason, from llguidance).
    #[error("{0}")]
    Compile(String),
    /// The sequence left the grammar (a token the mask did not allow was committed), or the
    /// grammar engine failed at a step.
    #[error("constraint: {0}")]
    Step(String),
}

/// The token-trie view of a vocabulary, as llguidance reads it.
struct VocabEnv {
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Greedy longest-match over the trie. Only grammars naming literal token text use it
    /// (the sampling loop never asks for forced tokens), so it is declared non-canonical.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Compiles grammars for one vocabulary. Cheap to clone (shared).
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
    digits: Arc<Vec<DigitRun>>,
}

/// The ASCII digits at the ends of one token's bytes.
#[derive(Clone, Copy, Debug, Default)]
struct DigitRun {
    /// Digits it starts with.
    lead: u8,
    /// Digits it ends with.
    trail: u8,
    /// It is all digits (and not empty).
    all: bool,
}

impl DigitRun {
    fn of(word: &[u8]) -> Self {
        let lead = word.iter().take_while(|b| b.is_ascii_digit()).count();
        let trail = word.iter().rev().take_while(|b| b.is_ascii_digit()).count();
        Self {
            lead: lead.min(255) as u8,
            trail: trail.min(255) as u8,
            all: !word.is_empty() && lead == word.len(),
        }
    }
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("n_vocab", &self.n_vocab)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// The compiler for `tokenizer`'s vocabulary, with masks `n_vocab` wide (the model's logits
    /// width, at least the tokenizer's vocabulary; ids past the vocabulary are never allowed).
    ///
    /// # Errors
    /// [`StructuredError::Compile`] when the vocabulary has no end-of-generation token or the
    /// token trie cannot be built.
    pub fn new(tokenizer: &GgufTokenizer, n_vocab: usize) -> Result<Self, StructuredError> {
        let n_vocab = n_vocab.max(tokenizer.vocab_size());
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n_vocab);
        for id in 0..tokenizer.vocab_size() as u32 {
            let word = if tokenizer.is_control(id) {
                // llguidance's marker for a special token: 0xFF then its text.
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tokenizer.token_text(id).unwrap_or_default().as_bytes());
                w
            } else {
                tokenizer.token_bytes(id, false).unwrap_or_default()
            };
            words.push(word);
        }
        words.resize(n_vocab, Vec::new());
        let digits = Arc::new(words.iter().map(|w| DigitRun::of(w)).collect());
        let eog = tokenizer.eog_ids();
        let Some(&first) = eog.first() else {
            return Err(StructuredError::Compile(
                "the vocabulary has no end-of-generation token".into(),
            ));
        };
        let eos = tokenizer.eot_id().or(tokenizer.eos_id()).unwrap_or(first);
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let trie =
            std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(eog))
                .map_err(|_| StructuredError::Compile("could not build the token trie".into()))?;
        let env: llguidance::toktrie::TokEnv = Arc::new(VocabEnv { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| StructuredError::Compile(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            n_vocab,
            digits,
        })
    }

    /// Width of the masks: the model's vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// A fresh constraint for one sequence following `grammar`.
    ///
    /// # Errors
    /// [`StructuredError::Compile`] with llguidance's reason: a schema that is not an object,
    /// unsupported keywords, a bad regex, a source past [`MAX_GRAMMAR_BYTES`], a grammar past
    /// llguidance's size limits.
    pub fn compile(&self, grammar: &Grammar) -> Result<TokenConstraint, StructuredError> {
        let bad = |m: String| StructuredError::Compile(m);
        let top = match grammar {
            Grammar::JsonObject => json_grammar(serde_json::json!({"type": "object"}))?,
            Grammar::JsonSchema(schema) => {
                let size = serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len());
                if size > MAX_GRAMMAR_BYTES {
                    return Err(bad(format!(
                        "the schema is {size} bytes; at most {MAX_GRAMMAR_BYTES}"
                    )));
                }
                json_grammar(schema.clone())?
            }
            Grammar::Regex(rx) | Grammar::Lark(rx) if rx.len() > MAX_GRAMMAR_BYTES => {
                return Err(bad(format!(
                    "the grammar is {} bytes; at most {MAX_GRAMMAR_BYTES}",
                    rx.len()
                )));
            }
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        let factory = &self.factory;
        let parser =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory.create_parser(top)))
                .map_err(|_| bad("the grammar engine failed on this grammar".into()))?
                .map_err(|e| bad(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(bad(e));
        }
        let json = match grammar {
            Grammar::JsonObject | Grammar::JsonSchema(_) => true,
            Grammar::Lark(text) => text.contains("%json"),
            Grammar::Regex(_) => false,
        };
        Ok(TokenConstraint {
            matcher,
            n_vocab: self.n_vocab,
            digits: json.then(|| self.digits.clone()),
            run: 0,
        })
    }
}

/// A JSON-schema grammar with the bounded whitespace of this module, unless the schema sets
/// its own `x-guidance` options.
fn json_grammar(mut schema: serde_json::Value) -> Result<TopLevelGrammar, StructuredError> {
    let Some(obj) = schema.as_object_mut() else {
        return Err(StructuredError::Compile(format!(
            "a JSON schema must be an object, got {}",
            kind(&schema)
        )));
    };
    if !obj.contains_key("x-guidance") {
        obj.insert("x-guidance".into(), json_options());
    }
    Ok(TopLevelGrammar::from_json_schema(schema))
}

/// llguidance's JSON options with this module's bounded whitespace, as the `x-guidance` value
/// at the top of a schema (also of a Lark grammar's `%json` schema: `tool_calls`).
pub(crate) fn json_options() -> serde_json::Value {
    let options = JsonCompileOptions {
        whitespace_flexible: false,
        whitespace_pattern: Some(JSON_WHITESPACE.into()),
        ..JsonCompileOptions::default()
    };
    serde_json::to_value(&options).unwrap_or_default()
}

/// The JSON type name of `v`, for messages.
fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// One sequence's grammar state: which tokens may come next.
#[derive(Clone)]
pub struct TokenConstraint {
    matcher: Matcher,
    n_vocab: usize,
    /// Each token's digit ends, for a JSON grammar's digit-run limit (`None`: no limit).
    digits: Option<Arc<Vec<DigitRun>>>,
    /// Digits the text written so far ends with.
    run: usize,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint")
            .field("n_vocab", &self.n_vocab)
            .field("done", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl TokenConstraint {
    /// The tokens allowed next, as a bit per token id (`n_vocab` long): when the grammar is
    /// complete only the end-of-generation tokens. In a JSON grammar, not a token that would
    /// make a run of digits longer than [`MAX_DIGIT_RUN`] while another token is allowed.
    ///
    /// # Errors
    /// [`StructuredError::Step`] when the grammar engine failed.
    pub fn compute_allowed(&mut self) -> Result<Vec<bool>, StructuredError> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| StructuredError::Step(e.to_string()))?;
        let mut out = vec![false; self.n_vocab];
        mask.iter_set_entries(|i| {
            if let Some(b) = out.get_mut(i) {
                *b = true;
            }
        });
        if !out.iter().any(|&b| b) {
            return Err(StructuredError::Step("no token is allowed".into()));
        }
        if let Some(d) = &self.digits
            && self.run > 0
        {
            let too_long = |i: usize| {
                d.get(i)
                    .is_some_and(|t| t.lead > 0 && self.run + t.lead as usize > MAX_DIGIT_RUN)
            };
            let other = (0..out.len()).any(|i| out[i] && !too_long(i));
            if other {
                for (i, ok) in out.iter_mut().enumerate() {
                    *ok &= !too_long(i);
                }
            }
        }
        Ok(out)
    }

    /// [`Self::compute_allowed`] as an additive bias over the logits, `[n_vocab]` f32: `0.0`
    /// where allowed, `-inf` elsewhere.
    ///
    /// # Errors
    /// As [`Self::compute_allowed`].
    pub fn compute_bias(&mut self) -> Result<Vec<f32>, StructuredError> {
        Ok(self
            .compute_allowed()?
            .into_iter()
            .map(|ok| if ok { 0.0 } else { f32::NEG_INFINITY })
            .collect())
    }

    /// Takes the sampled `token` into the grammar state.
    ///
    /// # Errors
    /// [`StructuredError::Step`] when `token` was not allowed (the mask was not applied).
    pub fn commit(&mut self, token: u32) -> Result<(), StructuredError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| StructuredError::Step(e.to_string()))?;
        if let Some(t) = self.digits.as_ref().and_then(|d| d.get(token as usize)) {
            self.run = if t.all {
                self.run + t.lead as usize
            } else {
                t.trail as usize
            };
        }
        Ok(())
    }

    /// Whether the grammar is complete and allows nothing more but the end of generation.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the text so far is a complete match (more may still follow).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// `logits` `[rows, vocab]` with `bias` `[vocab]` (from [`TokenConstraint::compute_bias`])
/// added to row `row`: the other rows are untouched. `bias` is uploaded once (4 bytes a token).
///
/// # Errors
/// [`StructuredError::Step`] when `bias` is not `vocab` long or `row` is out of range.
pub fn apply_bias(
    logits: Tensor<2>,
    row: usize,
    bias: Vec<f32>,
) -> Result<Tensor<2>, StructuredError> {
    let [rows, vocab] = logits.dims();
    if bias.len() != vocab || row >= rows {
        return Err(StructuredError::Step(format!(
            "a mask of {} tokens for row {row} of logits [{rows}, {vocab}]",
            bias.len()
        )));
    }
    let device = logits.device();
    let bias = Tensor::<2>::from_data(TensorData::new(bias, [1, vocab]), &device);
    let masked = logits.clone().slice([row..row + 1, 0..vocab]) + bias;
    Ok(logits.slice_assign([row..row + 1, 0..vocab], masked))
}
