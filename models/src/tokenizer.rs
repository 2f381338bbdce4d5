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

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

use gguf::{GgufFile, MetadataArray, MetadataValue};

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

/// The special-token id keys llama.cpp reads, in its order (spelling as in llama.cpp,
/// `seperator` included; the deprecated `prefix/suffix/middle` keys come last and win).
const ID_KEYS: [(&str, SpecialSlot); 17] = [
    (KEY_BOS_ID, SpecialSlot::Bos),
    (KEY_EOS_ID, SpecialSlot::Eos),
    (KEY_EOT_ID, SpecialSlot::Eot),
    (KEY_EOM_ID, SpecialSlot::Eom),
    (KEY_UNK_ID, SpecialSlot::Unk),
    ("tokenizer.ggml.seperator_token_id", SpecialSlot::Sep),
    (KEY_PAD_ID, SpecialSlot::Pad),
    ("tokenizer.ggml.mask_token_id", SpecialSlot::Mask),
    ("tokenizer.ggml.fim_pre_token_id", SpecialSlot::FimPre),
    ("tokenizer.ggml.fim_suf_token_id", SpecialSlot::FimSuf),
    ("tokenizer.ggml.fim_mid_token_id", SpecialSlot::FimMid),
    ("tokenizer.ggml.fim_pad_token_id", SpecialSlot::FimPad),
    ("tokenizer.ggml.fim_rep_token_id", SpecialSlot::FimRep),
    ("tokenizer.ggml.fim_sep_token_id", SpecialSlot::FimSep),
    ("tokenizer.ggml.prefix_token_id", SpecialSlot::FimPre),
    ("tokenizer.ggml.suffix_token_id", SpecialSlot::FimSuf),
    ("tokenizer.ggml.middle_token_id", SpecialSlot::FimMid),
];

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

/// Largest vocabulary accepted: llama.cpp token ids are `int32_t`.
const MAX_VOCAB: usize = i32::MAX as usize;

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

/// The slots of special tokens that llama.cpp tracks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpecialSlot {
    Bos,
    Eos,
    Eot,
    Eom,
    Unk,
    Sep,
    Pad,
    Mask,
    FimPre,
    FimSuf,
    FimMid,
    FimPad,
    FimRep,
    FimSep,
}

/// Special token ids (llama.cpp `special_*_id`); `None` is `LLAMA_TOKEN_NULL`.
#[derive(Clone, Debug, Default)]
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    pad: Option<u32>,
    mask: Option<u32>,
    fim_pre: Option<u32>,
    fim_suf: Option<u32>,
    fim_mid: Option<u32>,
    fim_pad: Option<u32>,
    fim_rep: Option<u32>,
    fim_sep: Option<u32>,
}

impl SpecialIds {
    fn slot(&mut self, slot: SpecialSlot) -> &mut Option<u32> {
        match slot {
            SpecialSlot::Bos => &mut self.bos,
            SpecialSlot::Eos => &mut self.eos,
            SpecialSlot::Eot => &mut self.eot,
            SpecialSlot::Eom => &mut self.eom,
            SpecialSlot::Unk => &mut self.unk,
            SpecialSlot::Sep => &mut self.sep,
            SpecialSlot::Pad => &mut self.pad,
            SpecialSlot::Mask => &mut self.mask,
            SpecialSlot::FimPre => &mut self.fim_pre,
            SpecialSlot::FimSuf => &mut self.fim_suf,
            SpecialSlot::FimMid => &mut self.fim_mid,
            SpecialSlot::FimPad => &mut self.fim_pad,
            SpecialSlot::FimRep => &mut self.fim_rep,
            SpecialSlot::FimSep => &mut self.fim_sep,
        }
    }
}

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
    /// Builds the tokenizer from the `tokenizer.ggml.*` metadata of `file`.
    ///
    /// Reads `tokenizer.ggml.model` (`llama` or `gpt2`), `tokens` (`ARRAY[STRING]`), `scores`
    /// (`ARRAY[FLOAT32]`, or `ARRAY[INT32]` as llama.cpp also accepts; optional, default 0),
    /// `token_type` (`ARRAY[INT32]`; optional, default normal), `merges` (`ARRAY[STRING]`, `gpt2`
    /// only), `pre`, the special-token ids and the `add_bos_token` / `add_eos_token` /
    /// `add_space_prefix` flags, with llama.cpp's defaults for absent keys.
    ///
    /// # Errors
    ///
    /// A [`TokenizerError`] naming the key when a required key is missing, an array has the
    /// wrong element type (C06: scores must be FLOAT32, token types INT32, merges STRING; the
    /// element type is checked before any element is used) or a length other than the number of
    /// tokens, a token text repeats, a special-token id key is out of range, `add_bos_token` is
    /// true without a BOS token, or the model / pre-tokenizer name is not supported.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = match file.get(KEY_MODEL) {
            None => return Err(TokenizerError::MissingKey { key: KEY_MODEL }),
            Some(v) => v.as_str().ok_or_else(|| key_type(KEY_MODEL, "STRING", v))?,
        };
        let vocab_type = match model {
            "llama" => VocabType::Spm,
            "gpt2" => VocabType::Bpe,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let pre = match file.get(KEY_PRE) {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| key_type(KEY_PRE, "STRING", v))?),
        };

        let tokens = string_array(file.get(KEY_TOKENS), KEY_TOKENS)?
            .ok_or(TokenizerError::MissingKey { key: KEY_TOKENS })?;
        let n = tokens.len();
        if n == 0 || n > MAX_VOCAB {
            return Err(TokenizerError::VocabSize(n));
        }
        let scores = read_scores(file.get(KEY_SCORES), n)?;
        let types = read_token_types(file.get(KEY_TOKEN_TYPE), n)?;
        let merges = match vocab_type {
            VocabType::Bpe => Some(
                string_array(file.get(KEY_MERGES), KEY_MERGES)?
                    .ok_or(TokenizerError::MissingKey { key: KEY_MERGES })?,
            ),
            VocabType::Spm => None,
        };

        let mut ids = Vec::new();
        for (key, slot) in ID_KEYS {
            if let Some(id) = file.get_opt_u32(key)? {
                ids.push((key, slot, id));
            }
        }
        let flag = |key: &'static str| -> Result<Option<bool>> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_bool()
                    .map(Some)
                    .ok_or_else(|| key_type(key, "BOOL", v)),
            }
        };
        let name = file.get("general.name").and_then(|v| v.as_str());

        Self::build(VocabSpec {
            vocab_type,
            pre,
            tokens,
            scores,
            types,
            merges,
            special_ids: ids,
            add_bos: flag(KEY_ADD_BOS)?,
            add_eos: flag(KEY_ADD_EOS)?,
            add_space_prefix: flag(KEY_ADD_SPACE_PREFIX)?,
            model_name: name,
        })
    }

    fn build(spec: VocabSpec<'_>) -> Result<Self> {
        let n = spec.tokens.len();
        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = FastMap::with_capacity_and_hasher(n, Default::default());
        for (i, t) in spec.tokens.iter().enumerate() {
            let text = if t.is_empty() {
                tracing::warn!("{KEY_TOKENS}: empty token at index {i}");
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            let id = i as u32;
            if let Some(first) = token_to_id.insert(text.clone(), id) {
                return Err(TokenizerError::DuplicateToken {
                    text,
                    first,
                    second: id,
                });
            }
            tokens.push(text);
        }
        let scores: Vec<f32> = match spec.scores {
            Some(s) => s
                .into_iter()
                .map(|v| {
                    if v.is_nan() {
                        f32::NEG_INFINITY
                    } else {
                        v + 0.0
                    }
                })
                .collect(),
            None => vec![0.0; n],
        };
        let mut attrs: Vec<u16> = match spec.types {
            Some(t) => t.iter().map(|&t| attr::from_type(t)).collect(),
            None => vec![attr::NORMAL; n],
        };

        // Vocabulary-type defaults (llama.cpp `load`).
        let mut ids = SpecialIds::default();
        let (mut add_bos, mut add_space_prefix, clean_spaces, escape_whitespaces, pre_cfg);
        match spec.vocab_type {
            VocabType::Spm => {
                ids.bos = Some(1);
                ids.eos = Some(2);
                ids.unk = Some(0);
                add_space_prefix = true;
                add_bos = true;
                clean_spaces = false;
                escape_whitespaces = true;
                pre_cfg = None;
            }
            VocabType::Bpe => {
                let cfg = bpe_pre_config(spec.pre)?;
                ids.bos = (!cfg.no_bos).then_some(11);
                ids.eos = Some(11);
                add_space_prefix = false;
                add_bos = cfg.add_bos;
                clean_spaces = cfg.clean_spaces.unwrap_or(true);
                escape_whitespaces = false;
                pre_cfg = Some(cfg);
            }
        }
        let mut add_eos = false;
        if let Some(v) = spec.add_space_prefix {
            add_space_prefix = v;
        }

        // Special ids: defaults outside the vocabulary are disabled; keys outside it are errors.
        for slot in [
            SpecialSlot::Bos,
            SpecialSlot::Eos,
            SpecialSlot::Unk,
            SpecialSlot::Sep,
            SpecialSlot::Pad,
        ] {
            let s = ids.slot(slot);
            if s.is_some_and(|id| id as usize >= n) {
                *s = None;
            }
        }
        for &(key, slot, id) in &spec.special_ids {
            if id as usize >= n {
                return Err(TokenizerError::SpecialIdOutOfRange {
                    key,
                    id,
                    n_vocab: n,
                });
            }
            *ids.slot(slot) = Some(id);
        }
        if let Some(v) = spec.add_bos {
            add_bos = v;
        }
        if let Some(v) = spec.add_eos {
            add_eos = v;
        }
        if add_bos && ids.bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: KEY_ADD_BOS,
                id_key: KEY_BOS_ID,
            });
        }
        if add_eos && ids.eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: KEY_ADD_EOS,
                id_key: KEY_EOS_ID,
            });
        }

        // Special tokens found by their text, and the end-of-generation set.
        let eog = detect_specials(&token_to_id, &mut attrs, &mut ids);

        // The special-token cache: control, user-defined and unknown tokens, longest first.
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        order.sort_by(|&a, &b| {
            tokens[b as usize]
                .len()
                .cmp(&tokens[a as usize].len())
                .then(a.cmp(&b))
        });

        // Per-model attributes (llama.cpp sets them by `general.name` after building the cache).
        let model_name = spec.model_name.unwrap_or("").to_lowercase();
        if model_name.contains("phi-3") || model_name.contains("phi3") {
            for &id in &order {
                attrs[id as usize] |= attr::RSTRIP;
            }
            if let Some(&id) = token_to_id.get("</s>") {
                attrs[id as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = token_to_id.get(t) {
                    attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }
        let specials = SpecialMatcher::new(&tokens, order);

        let mut byte_tokens = [None; 256];
        let mut spm_joins_space = HashSet::default();
        if spec.vocab_type == VocabType::Spm {
            for t in &tokens {
                let mut prev = None;
                for c in t.chars() {
                    if let Some(p) = prev
                        && c == '\u{2581}'
                    {
                        spm_joins_space.insert(p);
                    }
                    prev = Some(c);
                }
            }
        }
        if spec.vocab_type == VocabType::Spm {
            for (b, slot) in byte_tokens.iter_mut().enumerate() {
                let hex = format!("<0x{b:02X}>");
                *slot = token_to_id.get(hex.as_str()).copied().or_else(|| {
                    let c = [b as u8];
                    std::str::from_utf8(&c)
                        .ok()
                        .and_then(|s| token_to_id.get(s).copied())
                });
            }
        }
        for (id, (&a, t)) in attrs.iter().zip(&tokens).enumerate() {
            if a & attr::BYTE != 0 && parse_byte_token(t).is_none() {
                tracing::warn!("token {id} has type BYTE but its text {t:?} is not <0xXX>");
            }
        }

        let bpe = match (spec.vocab_type, pre_cfg) {
            (VocabType::Bpe, Some(cfg)) => Some(Box::new(build_hf_bpe(
                &tokens,
                spec.merges.unwrap_or(&[]),
                &cfg,
            )?)),
            _ => None,
        };

        Ok(Self {
            vocab_type: spec.vocab_type,
            tokens,
            scores,
            attrs,
            token_to_id,
            byte_tokens,
            spm_joins_space,
            specials,
            ids,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            escape_whitespaces,
            bpe,
        })
    }

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

    /// SentencePiece tokenization of one text fragment (llama.cpp `llm_tokenizer_spm_session`).
    ///
    /// llama.cpp runs one merge queue over the whole fragment. A merge joins two adjacent
    /// symbols into a token, so none can cross a `▁` whose preceding character never precedes
    /// `▁` inside a token; the pieces between such points merge independently and in the same
    /// order, so tokenizing them one by one gives the same ids with small queues.
    fn spm_tokenize(&self, fragment: &str, prefix_space: bool, out: &mut Vec<u32>) -> Result<()> {
        let mut text = String::with_capacity(fragment.len() + 3);
        if prefix_space {
            text.push(' ');
        }
        text.push_str(fragment);
        let text = text.replace(' ', "\u{2581}");
        let mut start = 0;
        let mut prev = None;
        for (i, c) in text.char_indices() {
            if c == '\u{2581}'
                && let Some(p) = prev
                && !self.spm_joins_space.contains(&p)
            {
                self.spm_merge(&text[start..i], out)?;
                start = i;
            }
            prev = Some(c);
        }
        self.spm_merge(&text[start..], out)
    }

    /// The bigram merge of llama.cpp's SPM tokenizer on escaped text.
    fn spm_merge(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }

        // One symbol per UTF-8 character, linked in a list.
        let mut syms: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }

        let mut queue = BinaryHeap::new();
        let try_add = |syms: &[Symbol],
                       queue: &mut BinaryHeap<Bigram>,
                       left: Option<usize>,
                       right: Option<usize>| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let start = syms[left].start;
            let size = syms[left].len + syms[right].len;
            if let Some(&id) = self.token_to_id.get(&text[start..start + size]) {
                queue.push(Bigram {
                    score: self.scores[id as usize],
                    left,
                    right,
                    size,
                });
            }
        };
        for i in 1..n {
            try_add(&syms, &mut queue, Some(i - 1), Some(i));
        }
        // Merge the highest-scoring pair (leftmost on ties) while any is left.
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left].len, syms[b.right].len);
            if l == 0 || r == 0 || l + r != b.size {
                continue;
            }
            syms[b.left].len += r;
            syms[b.right].len = 0;
            let right_next = syms[b.right].next;
            syms[b.left].next = right_next;
            if let Some(rn) = right_next {
                syms[rn].prev = Some(b.left);
            }
            try_add(&syms, &mut queue, syms[b.left].prev, Some(b.left));
            try_add(&syms, &mut queue, Some(b.left), syms[b.left].next);
        }

        let mut i = Some(0);
        while let Some(idx) = i {
            let s = &syms[idx];
            let piece = &text[s.start..s.start + s.len];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    // A character that is not a token: its UTF-8 bytes as byte tokens.
                    for b in piece.bytes() {
                        let id = self.byte_tokens[b as usize]
                            .or(self.ids.unk)
                            .ok_or(TokenizerError::NoByteToken(b))?;
                        out.push(id);
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }

    /// Byte-level BPE tokenization of one text fragment with the HF `tokenizers` model.
    fn bpe_tokenize(&self, fragment: &str, out: &mut Vec<u32>) -> Result<()> {
        let Some(bpe) = &self.bpe else {
            return Ok(());
        };
        let owned;
        let text = if self.escape_whitespaces {
            owned = fragment.replace(' ', "\u{2581}");
            owned.as_str()
        } else {
            fragment
        };
        let enc = bpe
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Hf(e.to_string()))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
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

/// Everything `build` needs, read from the metadata.
struct VocabSpec<'a> {
    vocab_type: VocabType,
    pre: Option<&'a str>,
    tokens: &'a [String],
    scores: Option<Vec<f32>>,
    types: Option<&'a [i32]>,
    merges: Option<&'a [String]>,
    special_ids: Vec<(&'static str, SpecialSlot, u32)>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
    add_space_prefix: Option<bool>,
    model_name: Option<&'a str>,
}

fn key_type(key: &'static str, expected: &'static str, found: &MetadataValue) -> TokenizerError {
    TokenizerError::KeyType {
        key,
        expected,
        found: found.value_type_name(),
    }
}

/// An optional ARRAY[STRING] value.
fn string_array<'a>(
    value: Option<&'a MetadataValue>,
    key: &'static str,
) -> Result<Option<&'a [String]>> {
    match value {
        None => Ok(None),
        Some(MetadataValue::Array(MetadataArray::String(v))) => Ok(Some(v)),
        Some(v) => Err(key_type(key, "an array of STRING", v)),
    }
}

/// `tokenizer.ggml.scores`: ARRAY[FLOAT32] (or ARRAY[INT32], converted, as llama.cpp accepts)
/// with one entry per token; absent gives `None`.
fn read_scores(value: Option<&MetadataValue>, n_tokens: usize) -> Result<Option<Vec<f32>>> {
    let scores: Vec<f32> = match value {
        None => return Ok(None),
        Some(MetadataValue::Array(MetadataArray::F32(v))) => v.clone(),
        Some(MetadataValue::Array(MetadataArray::I32(v))) => v.iter().map(|&x| x as f32).collect(),
        Some(v) => return Err(key_type(KEY_SCORES, "an array of FLOAT32 (or INT32)", v)),
    };
    if scores.len() != n_tokens {
        return Err(TokenizerError::LengthMismatch {
            key: KEY_SCORES,
            len: scores.len(),
            n_tokens,
        });
    }
    Ok(Some(scores))
}

/// `tokenizer.ggml.token_type`: ARRAY[INT32] with one entry per token; absent gives `None`.
fn read_token_types(value: Option<&MetadataValue>, n_tokens: usize) -> Result<Option<&[i32]>> {
    let types = match value {
        None => return Ok(None),
        Some(MetadataValue::Array(MetadataArray::I32(v))) => v.as_slice(),
        Some(v) => return Err(key_type(KEY_TOKEN_TYPE, "an array of INT32", v)),
    };
    if types.len() != n_tokens {
        return Err(TokenizerError::LengthMismatch {
            key: KEY_TOKEN_TYPE,
            len: types.len(),
            n_tokens,
        });
    }
    Ok(Some(types))
}

/// Texts llama.cpp takes as end-of-turn (`special_eot_id` when the key is absent).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Texts llama.cpp takes as end-of-generation (`special_eog_ids`), except `</s>` (see
/// [`GgufTokenizer::is_eog`]) and Gemma 4's tokens.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// llama.cpp's text-based detection of special tokens (EOT, EOM, FIM) and of the
/// end-of-generation set; tokens found this way become control tokens. Returns the sorted EOG ids.
fn detect_specials(
    token_to_id: &FastMap<String, u32>,
    attrs: &mut [u16],
    ids: &mut SpecialIds,
) -> Vec<u32> {
    // Scan in id order so the result does not depend on hash order (llama.cpp iterates an
    // unordered_map; vocabularies have at most one of each text anyway).
    let find = |texts: &[&str]| -> Option<u32> {
        texts
            .iter()
            .filter_map(|t| token_to_id.get(*t).copied())
            .min()
    };
    let detect: [(SpecialSlot, &[&str]); 8] = [
        (SpecialSlot::Eot, EOT_TEXTS),
        (SpecialSlot::Eom, &["<|eom_id|>"]),
        (
            SpecialSlot::FimPre,
            &[
                "<|fim_prefix|>",
                "<fim-prefix>",
                "<fim_prefix>",
                "<｜fim▁begin｜>",
                "<PRE>",
                "▁<PRE>",
                "<|code_prefix|>",
                "<|prefix|>",
            ],
        ),
        (
            SpecialSlot::FimSuf,
            &[
                "<|fim_suffix|>",
                "<fim-suffix>",
                "<fim_suffix>",
                "<｜fim▁hole｜>",
                "<SUF>",
                "▁<SUF>",
                "<|code_suffix|>",
                "<|suffix|>",
            ],
        ),
        (
            SpecialSlot::FimMid,
            &[
                "<|fim_middle|>",
                "<fim-middle>",
                "<fim_middle>",
                "<｜fim▁end｜>",
                "<MID>",
                "▁<MID>",
                "<|code_middle|>",
                "<|middle|>",
            ],
        ),
        (
            SpecialSlot::FimPad,
            &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
        ),
        (
            SpecialSlot::FimRep,
            &[
                "<|fim_repo|>",
                "<|repo_name|>",
                "<fim-repo>",
                "<REPO>",
                "<reponame>",
            ],
        ),
        (SpecialSlot::FimSep, &["<|file_sep|>"]),
    ];
    for (slot, texts) in detect {
        let s = ids.slot(slot);
        if s.is_none()
            && let Some(id) = find(texts)
        {
            *s = Some(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }

    let mut eog: HashSet<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for t in EOG_TEXTS {
        if let Some(&id) = token_to_id.get(*t) {
            eog.insert(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    // gpt-oss: these are always rendered.
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = token_to_id.get(t) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    // o200k_harmony and solar-open: `<|end|>` is not an end of generation when the vocabulary
    // has `<|return|>`/`<|call|>` or `<|calls|>`/`<|flush|>`.
    let has = |t: &str| token_to_id.get(t).is_some_and(|id| eog.contains(id));
    if let Some(&end) = token_to_id.get("<|end|>")
        && eog.contains(&end)
        && ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")))
    {
        eog.remove(&end);
        attrs[end as usize] = attr::USER_DEFINED;
    }
    let mut eog: Vec<u32> = eog.into_iter().collect();
    eog.sort_unstable();
    eog
}

/// The special tokens to cut out of text, and a fast way to find which of them occur in it.
struct SpecialMatcher {
    /// Special token ids, longest text first (ties by id).
    order: Vec<u32>,
    /// Text of each special token to its position in `order`.
    by_text: FastMap<String, usize>,
    /// For each first byte, the distinct lengths of special texts starting with it.
    lens_by_first_byte: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    fn new(tokens: &[String], order: Vec<u32>) -> Self {
        let mut by_text = FastMap::with_capacity_and_hasher(order.len(), Default::default());
        let mut lens_by_first_byte = vec![Vec::new(); 256];
        for (rank, &id) in order.iter().enumerate() {
            let t = &tokens[id as usize];
            by_text.insert(t.clone(), rank);
            let lens: &mut Vec<usize> = &mut lens_by_first_byte[t.as_bytes()[0] as usize];
            if !lens.contains(&t.len()) {
                lens.push(t.len());
            }
        }
        Self {
            order,
            by_text,
            lens_by_first_byte,
        }
    }

    /// The special tokens that occur in `text`, in partition order. Running the partition with
    /// only these gives the same result as with all of them, since fragments are substrings.
    fn candidates(&self, text: &str) -> Vec<u32> {
        let bytes = text.as_bytes();
        let mut ranks = Vec::new();
        for (pos, &b) in bytes.iter().enumerate() {
            for &len in &self.lens_by_first_byte[b as usize] {
                if let Some(s) = text.get(pos..pos + len)
                    && let Some(&rank) = self.by_text.get(s)
                {
                    ranks.push(rank);
                }
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        ranks.into_iter().map(|r| self.order[r]).collect()
    }
}

/// A symbol of the SPM merge list.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    /// Byte offset in the escaped text.
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent SPM symbols (llama.cpp `llm_bigram_spm`).
#[derive(Clone, Copy, Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    /// Highest score first, then leftmost: llama.cpp's comparator `l.score < r.score ||
    /// (l.score == r.score && l.left > r.left)` under a max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Bigram {}

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

/// llama.cpp's `clean_spaces` passes of `detokenize` (like `clean_up_tokenization_spaces`),
/// ported in place as written there.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // First pass: " ?", " !", " .", " ," lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
    // Second pass: a single apostrophe between spaces loses both spaces.
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);
    // Third pass: " 's", " 'm", " 're", " 've" lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let drop = match x1 {
                b's' | b'm' => true,
                b'r' | b'v' => i + 2 < n && text[i + 2] == b'e',
                _ => false,
            };
            if drop {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// GPT-2's byte-to-unicode table: the character standing for each byte in byte-level BPE.
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    table
}

/// The byte each byte-level character stands for (inverse of [`byte_to_char`]), indexed by
/// code point (all are below 324).
fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: std::sync::OnceLock<[i16; 324]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [-1i16; 324];
        for (b, c) in byte_to_char().iter().enumerate() {
            t[*c as usize] = b as i16;
        }
        t
    });
    table.get(c as usize).and_then(|&b| u8::try_from(b).ok())
}

/// Appends the bytes a byte-level BPE token stands for (llama.cpp `llama_decode_text`).
fn byte_level_decode(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// What a `tokenizer.ggml.pre` name selects (llama.cpp `llama_vocab::impl::load` and the
/// `llm_tokenizer_bpe` constructor).
#[derive(Clone, Debug)]
struct PreConfig {
    regexes: &'static [&'static str],
    ignore_merges: bool,
    add_bos: bool,
    /// Overrides the BPE default `clean_spaces = true`.
    clean_spaces: Option<bool>,
    /// The pre-tokenizer clears the BOS id (chatglm).
    no_bos: bool,
}

const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_DEFAULT: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    RE_GPT2,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// The pre-tokenizer for a `tokenizer.ggml.pre` name; a missing name is llama.cpp's `default`
/// (with a warning), an unknown one an error (C23).
fn bpe_pre_config(pre: Option<&str>) -> Result<PreConfig> {
    let cfg = |regexes, ignore_merges, add_bos, clean_spaces| PreConfig {
        regexes,
        ignore_merges,
        add_bos,
        clean_spaces,
        no_bos: false,
    };
    let Some(pre) = pre.filter(|p| !p.is_empty()) else {
        tracing::warn!(
            "{KEY_PRE} is missing: using the 'default' pre-tokenizer; tokenization may differ from training"
        );
        return Ok(cfg(RE_DEFAULT, false, false, None));
    };
    Ok(match pre {
        "default" => cfg(RE_DEFAULT, false, false, None),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => cfg(&[RE_LLAMA3], true, true, None),
        "dbrx" | "smaug-bpe" => cfg(&[RE_LLAMA3], false, false, None),
        "glm4" | "chatglm-bpe" => PreConfig {
            no_bos: true,
            ..cfg(&[RE_LLAMA3], false, false, None)
        },
        "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
        | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "jina-v1-en"
        | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" => {
            cfg(&[RE_GPT2], false, false, None)
        }
        "trillion" | "granite-docling" => cfg(&[RE_GPT2], false, false, Some(false)),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            cfg(&[r"\p{N}", RE_GPT2], false, false, None)
        }
        "command-r" | "smollm" => cfg(&[r"\p{N}", RE_GPT2], false, false, Some(false)),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
            cfg(&[RE_QWEN2], false, false, Some(false))
        }
        "megrez" | "stablelm2" => cfg(&[RE_QWEN2], false, false, None),
        "qwen35" => cfg(&[RE_QWEN35], false, false, Some(false)),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => cfg(&[RE_GPT4O], false, false, Some(false)),
        other => return Err(TokenizerError::UnsupportedPre(other.to_string())),
    })
}

/// The pre-tokenizer pieces of `text` under a `tokenizer.ggml.pre` name, before the byte-level
/// mapping (for tests of C23).
///
/// # Errors
///
/// [`TokenizerError::UnsupportedPre`] for an unknown name.
pub fn pre_tokenize(pre: &str, text: &str) -> Result<Vec<String>> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let cfg = bpe_pre_config(Some(pre))?;
    let seq = split_pre_tokenizer(&cfg, false)?;
    let mut pts = PreTokenizedString::from(text);
    seq.pre_tokenize(&mut pts)
        .map_err(|e| TokenizerError::Hf(e.to_string()))?;
    Ok(pts
        .get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(s, _, _)| s.to_string())
        .collect())
}

/// The `tokenizers` pre-tokenizer: each regex splits the pieces of the previous one, matches
/// and gaps both kept (llama.cpp `unicode_regex_split`), then optionally the byte-level mapping.
fn split_pre_tokenizer(
    cfg: &PreConfig,
    byte_level: bool,
) -> Result<tokenizers::pre_tokenizers::sequence::Sequence> {
    use tokenizers::SplitDelimiterBehavior;
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(cfg.regexes.len() + 1);
    for re in cfg.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Hf(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(split.into());
    }
    if byte_level {
        steps.push(ByteLevel::new(false, false, false).into());
    }
    Ok(tokenizers::pre_tokenizers::sequence::Sequence::new(steps))
}

/// The HF `tokenizers` byte-level BPE for a `gpt2` vocabulary. Special tokens are not registered
/// with it: [`GgufTokenizer::partition`] cuts them out first.
fn build_hf_bpe(
    tokens: &[String],
    merges: &[String],
    cfg: &PreConfig,
) -> Result<tokenizers::Tokenizer> {
    use tokenizers::models::bpe::{BPE, Vocab};
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut pairs = Vec::with_capacity(merges.len());
    for (index, m) in merges.iter().enumerate() {
        // llama.cpp splits at the first space after the first byte.
        let split = m
            .as_bytes()
            .get(1..)
            .and_then(|rest| rest.iter().position(|&b| b == b' '))
            .map(|p| p + 1)
            .ok_or_else(|| TokenizerError::BadMerge {
                index,
                text: m.clone(),
            })?;
        pairs.push((m[..split].to_string(), m[split + 1..].to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(cfg.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Hf(format!("building BPE from '{KEY_MERGES}': {e}")))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(split_pre_tokenizer(cfg, true)?));
    Ok(tk)
}

#[cfg(test)]
mod tests {
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
    fn c23_pre_tokenizer_follows_pre() {
        let p = |pre, s| pre_tokenize(pre, s).unwrap();
        assert_eq!(p("gpt-2", "x 12345"), ["x", " 12345"]);
        assert_eq!(p("llama-bpe", "x 12345"), ["x", " ", "123", "45"]);
        assert_eq!(p("qwen2", "x 12345"), ["x", " ", "1", "2", "3", "4", "5"]);
        for pre in ["gpt-2", "llama-bpe", "qwen2"] {
            assert_eq!(p(pre, "->"), ["->"]);
        }
        assert!(matches!(
            pre_tokenize("no-such-pre", "x"),
            Err(TokenizerError::UnsupportedPre(_))
        ));
    }

    #[test]
    fn clean_spaces_like_llama_cpp() {
        let mut s = b"Hello , world ! it 's a ' b".to_vec();
        clean_up_spaces(&mut s);
        assert_eq!(String::from_utf8(s).unwrap(), "Hello, world! it's a'b");
    }

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<GgufTokenizer>();
    }

    #[test]
    fn byte_level_table_is_gpt2() {
        let t = byte_to_char();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
    }
}
