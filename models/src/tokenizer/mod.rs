//! Tokenizer built from the `tokenizer.ggml.*` metadata of a GGUF file, reproducing llama.cpp.
//!
//! Source of the behaviour: llama.cpp `src/llama-vocab.cpp` (`llama_vocab::impl::load`,
//! `tokenizer_st_partition`, `llm_tokenizer_spm_session`, `llm_tokenizer_bpe`, `token_to_piece`,
//! `detokenize`); key names from the GGUF spec (`docs/gguf.md` in ggml-org/ggml).
//!
//! [`GgufTokenizer::encode`] gives the ids of `llama_tokenize(text, add_special, parse_special =
//! true)` and [`GgufTokenizer::decode`] the text of `llama_detokenize(ids, remove_special = false,
//! unparse_special = false)`.
//!
//! Two vocabulary types are supported (`tokenizer.ggml.model`):
//!
//! - `llama` (llama.cpp `LLAMA_VOCAB_TYPE_SPM`, SentencePiece-style: Llama 1/2, Gemma, Mistral v1,
//!   Phi-3): spaces become U+2581 `▁`, a space is prefixed when `tokenizer.ggml.add_space_prefix`
//!   is true (the default; Gemma 3 sets it false), pieces are merged pairwise by the score of the
//!   merged token (`tokenizer.ggml.scores`) and characters outside the vocabulary fall back to the
//!   `<0xXX>` byte tokens. This is a direct port of llama.cpp's bigram algorithm
//!   (`llm_tokenizer_spm_session`), not a `tokenizers` BPE with merges generated from the
//!   vocabulary (transformers' `GGUFLlamaConverter`): for Gemma's 262144 tokens that makes 514847
//!   merges and takes 0.8 s (release) to 2.8 s (this workspace's dev profile) to build, and it
//!   matches llama.cpp only while no two competing merges tie in score (it orders ties by token
//!   id, llama.cpp by position). The port is exact by construction, needs only the token-to-id
//!   map and builds in about 0.1-0.2 s.
//! - `gpt2` (llama.cpp `LLAMA_VOCAB_TYPE_BPE`, byte-level BPE: Qwen2/3, Llama 3, GPT-2 ...): the
//!   HF `tokenizers` BPE model with `tokenizer.ggml.merges` and `tokenizers` pre-tokenizers: the
//!   regexes llama.cpp selects by `tokenizer.ggml.pre` (an unknown name is an error), then the
//!   GPT-2 byte-to-unicode mapping.
//!
//! Before either, control (token type 3), user-defined (4) and unknown (2) tokens are cut out of
//! the text as whole tokens, longest first (llama.cpp `tokenizer_st_partition`).
//!
//! The parts live in submodules: `load` (reading the `tokenizer.ggml.*` metadata into a
//! `GgufTokenizer`, `llama_vocab::impl::load`), `spm` (SentencePiece merge,
//! `llm_tokenizer_spm_session`), `bpe` (byte-level BPE: pre-tokenizer regexes, the `tokenizers`
//! model, byte-level decoding, `llm_tokenizer_bpe`) and `special` (special-token ids,
//! end-of-generation detection and the matcher behind `tokenizer_st_partition`); partition,
//! encode and decode are here.

mod bpe;
mod load;
mod special;
mod spm;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

pub use bpe::pre_tokenize;

use bpe::{byte_level_decode, clean_up_spaces};
use special::{SpecialIds, SpecialMatcher};

/// `tokenizer.ggml.model`
pub const KEY_MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre`
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens`
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.scores`
pub const KEY_SCORES: &str = "tokenizer.ggml.scores";
/// `tokenizer.ggml.token_type`
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.merges`
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
/// `tokenizer.ggml.add_bos_token`
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// `tokenizer.ggml.add_eos_token`
pub const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// `tokenizer.ggml.add_space_prefix`
pub const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
/// `tokenizer.ggml.bos_token_id`
pub const KEY_BOS_ID: &str = "tokenizer.ggml.bos_token_id";
/// `tokenizer.ggml.eos_token_id`
pub const KEY_EOS_ID: &str = "tokenizer.ggml.eos_token_id";
/// `tokenizer.ggml.eot_token_id`
pub const KEY_EOT_ID: &str = "tokenizer.ggml.eot_token_id";
/// `tokenizer.ggml.eom_token_id`
pub const KEY_EOM_ID: &str = "tokenizer.ggml.eom_token_id";
/// `tokenizer.ggml.unknown_token_id`
pub const KEY_UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
/// `tokenizer.ggml.padding_token_id`
pub const KEY_PAD_ID: &str = "tokenizer.ggml.padding_token_id";

/// Token types of `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`).
pub mod token_type {
    /// `LLAMA_TOKEN_TYPE_UNDEFINED`
    pub const UNDEFINED: i32 = 0;
    /// `LLAMA_TOKEN_TYPE_NORMAL`
    pub const NORMAL: i32 = 1;
    /// `LLAMA_TOKEN_TYPE_UNKNOWN`
    pub const UNKNOWN: i32 = 2;
    /// `LLAMA_TOKEN_TYPE_CONTROL`
    pub const CONTROL: i32 = 3;
    /// `LLAMA_TOKEN_TYPE_USER_DEFINED`
    pub const USER_DEFINED: i32 = 4;
    /// `LLAMA_TOKEN_TYPE_UNUSED`
    pub const UNUSED: i32 = 5;
    /// `LLAMA_TOKEN_TYPE_BYTE`
    pub const BYTE: i32 = 6;
}

/// Token attribute bits (llama.cpp `llama_token_attr`).
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;

    /// The attribute for a `tokenizer.ggml.token_type` value (unknown values: undefined).
    pub fn from_type(t: i32) -> u16 {
        use super::token_type as tt;
        match t {
            tt::UNKNOWN => UNKNOWN,
            tt::UNUSED => UNUSED,
            tt::NORMAL => NORMAL,
            tt::CONTROL => CONTROL,
            tt::USER_DEFINED => USER_DEFINED,
            tt::BYTE => BYTE,
            _ => 0,
        }
    }
}

/// Why a tokenizer could not be built from GGUF metadata, or could not encode or decode.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required metadata key is absent.
    #[error("metadata key '{key}' is missing")]
    MissingKey {
        /// The key.
        key: &'static str,
    },

    /// A metadata key has a value of the wrong type (C06: `scores` declared as `ARRAY[UINT8]`).
    #[error("metadata key '{key}' must be {expected}, found {found}")]
    KeyType {
        /// The key.
        key: &'static str,
        /// What is accepted, e.g. "an array of FLOAT32".
        expected: &'static str,
        /// The GGUF type in the file, e.g. `ARRAY[UINT8]`.
        found: String,
    },

    /// An array does not have one entry per token.
    #[error("metadata key '{key}' has {len} entries but '{KEY_TOKENS}' has {n_tokens}")]
    LengthMismatch {
        /// The key of the array.
        key: &'static str,
        /// Its length.
        len: usize,
        /// The number of tokens.
        n_tokens: usize,
    },

    /// `tokenizer.ggml.tokens` is empty or larger than `i32::MAX`.
    #[error("metadata key '{KEY_TOKENS}' has {0} tokens; expected 1 to 2147483647")]
    VocabSize(usize),

    /// The same token text appears twice in `tokenizer.ggml.tokens`.
    #[error("duplicate token in '{KEY_TOKENS}': {text:?} has ids {first} and {second}")]
    DuplicateToken {
        /// The text.
        text: String,
        /// Its first id.
        first: u32,
        /// The other id.
        second: u32,
    },

    /// `tokenizer.ggml.model` names a vocabulary type this crate does not implement.
    #[error(
        "unsupported '{KEY_MODEL}' {0:?}: supported are \"llama\" (SentencePiece) and \"gpt2\" (byte-level BPE)"
    )]
    UnsupportedModel(String),

    /// `tokenizer.ggml.pre` names a pre-tokenizer whose regexes are not known here.
    #[error("unsupported '{KEY_PRE}' {0:?}: no pre-tokenizer regex is known for it")]
    UnsupportedPre(String),

    /// A special-token id key holds an id outside the vocabulary.
    #[error("metadata key '{key}' = {id} is out of range for a vocabulary of {n_vocab} tokens")]
    SpecialIdOutOfRange {
        /// The key.
        key: &'static str,
        /// The id found.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },

    /// `add_bos_token` / `add_eos_token` is true but the corresponding token is not set.
    #[error("metadata key '{flag}' is true, but '{id_key}' is not set")]
    MissingSpecialToken {
        /// The flag key.
        flag: &'static str,
        /// The id key.
        id_key: &'static str,
    },

    /// An entry of `tokenizer.ggml.merges` is not two tokens separated by a space.
    #[error(
        "metadata key '{KEY_MERGES}' entry {index} ({text:?}) is not two tokens separated by a space"
    )]
    BadMerge {
        /// Index of the entry.
        index: usize,
        /// Its text.
        text: String,
    },

    /// A token id passed to `decode` or `token_to_piece` is not in the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {n_vocab} tokens")]
    IdOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },

    /// SentencePiece byte fallback needed a byte that has no token (neither `<0xXX>` nor the
    /// byte itself), and the vocabulary has no unknown token.
    #[error(
        "no token for byte 0x{0:02X}: the vocabulary has neither <0x{0:02X}> nor an unknown token"
    )]
    NoByteToken(u8),

    /// Reading a metadata value failed.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),

    /// The HF `tokenizers` library failed (building the BPE model or encoding).
    #[error("tokenizers: {0}")]
    Hf(String),
}

/// Result alias of this module.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// The vocabulary type (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabType {
    /// `llama`: SentencePiece-style, scores and byte fallback (llama.cpp `LLAMA_VOCAB_TYPE_SPM`).
    Spm,
    /// `gpt2`: byte-level BPE with merges (llama.cpp `LLAMA_VOCAB_TYPE_BPE`).
    Bpe,
}

/// The tokenizer of a GGUF model: encodes text to token ids and decodes ids to text exactly as
/// llama.cpp does for the same file.
///
/// Build it with [`GgufTokenizer::from_gguf`]. It is `Send + Sync`; encoding takes `&self`.
pub struct GgufTokenizer {
    vocab_type: VocabType,
    /// Token texts, by id (empty tokens replaced by `[EMPTY_<id>]` like llama.cpp).
    tokens: Vec<String>,
    /// Scores by id, with NaN mapped to -inf and -0.0 to 0.0 so that `total_cmp` orders them as
    /// llama.cpp's `<` does.
    scores: Vec<f32>,
    /// llama.cpp token attributes by id.
    attrs: Vec<u16>,
    token_to_id: FastMap<String, u32>,
    /// SPM byte fallback: the token of each byte (`<0xXX>`, else the byte as a one-char token).
    byte_tokens: [Option<u32>; 256],
    /// SPM: the characters that precede `▁` inside some token. Before any other `▁` no merge
    /// can cross, so the text is tokenized in independent pieces there (see `spm_tokenize`).
    spm_joins_space: HashSet<char, BuildHasherDefault<FxHasher>>,
    specials: SpecialMatcher,
    ids: SpecialIds,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// Post-process decoded text like `clean_up_tokenization_spaces` (BPE only by default).
    clean_spaces: bool,
    /// BPE only: tokens use `▁` for spaces instead of the byte-level mapping.
    escape_whitespaces: bool,
    bpe: Option<Box<tokenizers::Tokenizer>>,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("vocab_type", &self.vocab_type)
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.ids.bos)
            .field("eos", &self.ids.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish_non_exhaustive()
    }
}

/// One piece of the input after special tokens are cut out.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fragment {
    /// Raw text: a byte range of the input.
    Text(Range<usize>),
    /// A special token matched as a whole.
    Token(u32),
}

impl GgufTokenizer {
    /// Encodes `text` like `llama_tokenize(text, add_special, parse_special = true)`: special
    /// tokens written in the text (`<start_of_turn>`, `<|im_end|>`, ...) become their ids, and
    /// with `add_special` BOS is prepended when `tokenizer.ggml.add_bos_token` is true (default
    /// true for `llama`) and EOS appended when `add_eos_token` is true. Like llama.cpp, a BOS
    /// already at the start of `text` is kept, giving two (see [`Self::encode_prompt`]).
    ///
    /// # Errors
    ///
    /// [`TokenizerError::NoByteToken`] when a character needs a byte token the vocabulary lacks,
    /// [`TokenizerError::Hf`] when the BPE model fails.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special, true)
    }

    /// Encodes like [`Self::encode`] with llama.cpp's `parse_special` flag: when false, control
    /// and unknown tokens in `text` are tokenized as plain text (user-defined tokens are still
    /// matched), which keeps untrusted text from injecting control tokens.
    ///
    /// # Errors
    ///
    /// As [`Self::encode`].
    pub fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.ids.bos);
        }
        match self.vocab_type {
            VocabType::Spm => {
                // Prefix a space to the first text and to text after a special token.
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(r) => {
                            self.spm_tokenize(
                                &text[r],
                                self.add_space_prefix && prev_special,
                                &mut out,
                            )?;
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            VocabType::Bpe => {
                for f in fragments {
                    match f {
                        Fragment::Text(r) => self.bpe_tokenize(&text[r], &mut out)?,
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.ids.eos);
        }
        Ok(out)
    }

    /// Encodes a rendered chat prompt: [`Self::encode`] with `add_special = true`, except that
    /// BOS is not added when the text already starts with the BOS token (a template's
    /// `{{ bos_token }}`), so the model sees exactly one (C24).
    ///
    /// # Errors
    ///
    /// As [`Self::encode`].
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text, true)?;
        if self.add_bos && ids.len() >= 2 && ids[0] == ids[1] && Some(ids[0]) == self.ids.bos {
            ids.remove(0);
        }
        Ok(ids)
    }

    /// Decodes ids to text like `llama_detokenize(ids, remove_special = false, unparse_special =
    /// false)`: control and unknown tokens (`<bos>`, `<end_of_turn>`) render as nothing,
    /// user-defined tokens as their text, byte tokens as their byte, and with `add_space_prefix`
    /// one leading space of the first piece is dropped. Byte sequences that are not valid UTF-8
    /// (a multi-byte character cut by the end of `ids`) become U+FFFD; use
    /// [`Self::decode_bytes`] for the raw bytes.
    ///
    /// # Errors
    ///
    /// [`TokenizerError::IdOutOfRange`] for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    /// The bytes [`Self::decode`] turns into text.
    ///
    /// # Errors
    ///
    /// [`TokenizerError::IdOutOfRange`] for an id outside the vocabulary.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        self.decode_bytes_with(ids, false)
    }

    /// Decodes like [`Self::decode`]; with `unparse_special` control and unknown tokens render
    /// as their text (`<start_of_turn>`), as llama.cpp's `unparse_special` flag does.
    ///
    /// # Errors
    ///
    /// [`TokenizerError::IdOutOfRange`] for an id outside the vocabulary.
    pub fn decode_with(&self, ids: &[u32], unparse_special: bool) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes_with(ids, unparse_special)?).into_owned())
    }

    /// The bytes [`Self::decode_with`] turns into text.
    ///
    /// # Errors
    ///
    /// [`TokenizerError::IdOutOfRange`] for an id outside the vocabulary.
    pub fn decode_bytes_with(&self, ids: &[u32], unparse_special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let start = out.len();
            self.push_piece(id, unparse_special, &mut out)?;
            if remove_space && out.get(start) == Some(&b' ') {
                out.remove(start);
            }
            remove_space = false;
        }
        if self.clean_spaces {
            clean_up_spaces(&mut out);
        }
        Ok(out)
    }

    /// The text of one token as llama.cpp's `llama_token_to_piece(id, lstrip = 0, special =
    /// true)` gives it: control tokens as their text (`<end_of_turn>`), `▁` as a space (SPM),
    /// byte-level characters as their bytes (BPE), a byte token as its byte. A piece that is not
    /// valid UTF-8 on its own (one byte of a multi-byte character) becomes U+FFFD; use
    /// [`Self::token_bytes`] when streaming.
    ///
    /// # Errors
    ///
    /// [`TokenizerError::IdOutOfRange`] for an id outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.token_bytes(id, true)?).into_owned())
    }

    /// The bytes of one token's piece; with `special = false` control and unknown tokens give
    /// nothing, as in [`Self::decode`].
    ///
    /// # Errors
    ///
    /// [`TokenizerError::IdOutOfRange`] for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32, special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.push_piece(id, special, &mut out)?;
        Ok(out)
    }

    /// The raw vocabulary text of a token (`▁Hello`, `<0x0A>`, `<bos>`), if `id` is in range.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary text, if it is a token.
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The BOS token (`tokenizer.ggml.bos_token_id`, llama.cpp's default for the type otherwise).
    pub fn bos_id(&self) -> Option<u32> {
        self.ids.bos
    }

    /// The EOS token (`tokenizer.ggml.eos_token_id`, llama.cpp's default for the type otherwise).
    pub fn eos_id(&self) -> Option<u32> {
        self.ids.eos
    }

    /// The end-of-turn token (`tokenizer.ggml.eot_token_id`, or found by its text:
    /// `<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`, ...).
    pub fn eot_id(&self) -> Option<u32> {
        self.ids.eot
    }

    /// The unknown token, if any.
    pub fn unk_id(&self) -> Option<u32> {
        self.ids.unk
    }

    /// The padding token, if any.
    pub fn pad_id(&self) -> Option<u32> {
        self.ids.pad
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The vocabulary type.
    pub fn vocab_type(&self) -> VocabType {
        self.vocab_type
    }

    /// Whether `encode(_, true)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(_, true)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether the token ends generation (llama.cpp `llama_vocab_is_eog`): EOS, EOT, EOM, the
    /// FIM pad/repo/separator tokens, and tokens whose text marks an end (`<end_of_turn>`,
    /// `<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...).
    ///
    /// Unlike llama.cpp, `</s>` counts only when it is EOS: in Gemma 3's vocabulary it is the
    /// HTML strikethrough end tag, not an end marker.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether the token is a control token (type 3, or made one by llama.cpp's rules).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// Appends the piece of `id` (llama.cpp `token_to_piece` with `lstrip = 0`).
    fn push_piece(&self, id: u32, special: bool, out: &mut Vec<u8>) -> Result<()> {
        let a = *self
            .attrs
            .get(id as usize)
            .ok_or(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.tokens.len(),
            })?;
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Ok(());
        }
        let text = &self.tokens[id as usize];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            if self.vocab_type == VocabType::Spm || self.escape_whitespaces {
                out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes());
            } else {
                byte_level_decode(text, out);
            }
        } else if a & attr::BYTE != 0 {
            match parse_byte_token(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            }
        }
        // Unused and undefined tokens render as nothing, as in llama.cpp.
        Ok(())
    }

    /// Cuts the special tokens out of `text` (llama.cpp `tokenizer_st_partition`): each special
    /// token, longest first, splits every remaining text fragment at each of its occurrences.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(0..text.len())];
        for id in self.specials.candidates(text) {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(r) = f else {
                    next.push(f);
                    continue;
                };
                let mut start = r.start;
                while let Some(pos) = text[start..r.end].find(needle) {
                    let m = start + pos;
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && is_c_space(text.as_bytes()[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start..left_end));
                    }
                    next.push(Fragment::Token(id));
                    start = m + needle.len();
                    if a & attr::RSTRIP != 0 {
                        while start < r.end && is_c_space(text.as_bytes()[start]) {
                            start += 1;
                        }
                    }
                }
                if start < r.end {
                    next.push(Fragment::Text(start..r.end));
                }
            }
            frags = next;
        }
        frags
    }
}

/// A hash map with [`FxHasher`].
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The Fx hash of rustc (`rustc-hash`): several times faster than SipHash on the short strings
/// of token lookups, which dominate SPM tokenization. The keys are the model's tokens, so only
/// a hostile model file could make them collide.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// C `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The byte of a `<0xXX>` token.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use gguf::{MetadataArray, MetadataValue};

    use super::load::{VocabSpec, read_scores, read_token_types, string_array};
    use super::*;

    fn spec<'a>(tokens: &'a [String], scores: Vec<f32>, types: &'a [i32]) -> VocabSpec<'a> {
        VocabSpec {
            vocab_type: VocabType::Spm,
            pre: None,
            tokens,
            scores: Some(scores),
            types: Some(types),
            merges: None,
            special_ids: Vec::new(),
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            model_name: None,
        }
    }

    /// A small SentencePiece vocabulary: <unk> <s> </s>, bytes, then pieces by score.
    fn tiny_spm(add_space_prefix: Option<bool>) -> GgufTokenizer {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![
            token_type::UNKNOWN,
            token_type::CONTROL,
            token_type::CONTROL,
        ];
        let mut scores = vec![0.0, 0.0, 0.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(token_type::BYTE);
            scores.push(0.0);
        }
        let pieces = [
            "▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "he", "ll", "llo", "▁he", "▁hello", "▁w",
            "or", "▁wor", "ld", "▁world", "<tag>",
        ];
        for (i, p) in pieces.iter().enumerate() {
            tokens.push((*p).to_string());
            types.push(if *p == "<tag>" {
                token_type::USER_DEFINED
            } else {
                token_type::NORMAL
            });
            scores.push(-(i as f32));
        }
        let mut s = spec(&tokens, scores, &types);
        s.add_space_prefix = add_space_prefix;
        GgufTokenizer::build(s).unwrap()
    }

    fn ids_of(t: &GgufTokenizer, texts: &[&str]) -> Vec<u32> {
        texts.iter().map(|x| t.token_to_id(x).unwrap()).collect()
    }

    #[test]
    fn spm_merges_by_score_with_space_prefix() {
        let t = tiny_spm(None);
        assert_eq!(
            t.encode("hello world", false).unwrap(),
            ids_of(&t, &["▁hello", "▁world"])
        );
        assert_eq!(t.encode("hello", true).unwrap()[0], 1);
        let ids = t.encode("hello world", false).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), "hello world");
        // As in llama.cpp, the leading space is dropped from the first piece only, and a BOS
        // (rendered as nothing) is that first piece.
        let ids = t.encode("hello world", true).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), " hello world");
    }

    #[test]
    fn spm_byte_fallback_and_specials() {
        let t = tiny_spm(Some(false));
        // 'é' is not a token: its two UTF-8 bytes.
        let ids = t.encode("é<tag>he", false).unwrap();
        let mut want = vec![
            t.token_to_id("<0xC3>").unwrap(),
            t.token_to_id("<0xA9>").unwrap(),
        ];
        want.extend(ids_of(&t, &["<tag>", "he"]));
        assert_eq!(ids, want);
        assert_eq!(t.decode(&ids).unwrap(), "é<tag>he");
        // Control tokens are cut out as whole tokens and decode to nothing.
        let ids = t.encode("</s>he", false).unwrap();
        assert_eq!(ids, vec![2, t.token_to_id("he").unwrap()]);
        assert_eq!(t.decode(&ids).unwrap(), "he");
        assert_eq!(t.token_to_piece(2).unwrap(), "</s>");
        // parse_special = false: control text is plain text, user-defined still matched.
        let ids = t.encode_with("</s><tag>", false, false).unwrap();
        assert!(!ids.contains(&2));
        assert!(ids.contains(&t.token_to_id("<tag>").unwrap()));
        assert!(t.decode(&[100_000]).is_err());
    }

    #[test]
    fn partition_is_longest_first_not_leftmost() {
        // llama.cpp cuts "bcd" (longer) before "ab" even though "ab" starts first.
        let tokens: Vec<String> = ["<unk>", "ab", "bcd", "a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let types = [
            token_type::UNKNOWN,
            token_type::USER_DEFINED,
            token_type::USER_DEFINED,
            token_type::NORMAL,
        ];
        let mut s = spec(&tokens, vec![0.0; 4], &types);
        s.add_space_prefix = Some(false);
        s.add_bos = Some(false);
        let t = GgufTokenizer::build(s).unwrap();
        assert_eq!(
            t.partition("abcd", true),
            vec![Fragment::Text(0..1), Fragment::Token(2)]
        );
    }

    #[test]
    fn c06_scores_must_be_f32() {
        let bad = MetadataValue::Array(MetadataArray::U8(vec![0; 8]));
        let err = read_scores(Some(&bad), 8).unwrap_err().to_string();
        assert!(err.contains("tokenizer.ggml.scores"), "{err}");
        assert!(err.contains("must be an array of FLOAT32"), "{err}");
        assert!(err.contains("ARRAY[UINT8]"), "{err}");
        let short = MetadataValue::Array(MetadataArray::F32(vec![0.0; 7]));
        assert!(matches!(
            read_scores(Some(&short), 8),
            Err(TokenizerError::LengthMismatch {
                key: KEY_SCORES,
                len: 7,
                n_tokens: 8
            })
        ));
        let bad = MetadataValue::Array(MetadataArray::U32(vec![0; 8]));
        let err = read_token_types(Some(&bad), 8).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.ggml.token_type") && err.contains("INT32"),
            "{err}"
        );
        let bad = MetadataValue::Array(MetadataArray::U8(vec![0; 8]));
        let err = string_array(Some(&bad), KEY_MERGES)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tokenizer.ggml.merges") && err.contains("STRING"),
            "{err}"
        );
    }

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<GgufTokenizer>();
    }
}
