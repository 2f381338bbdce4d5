//! Reads the `tokenizer.ggml.*` metadata of a GGUF file into a [`GgufTokenizer`] (llama.cpp
//! `llama_vocab::impl::load` in `src/llama-vocab.cpp`).

use std::collections::HashSet;

use gguf::{GgufFile, MetadataArray, MetadataValue};

use super::bpe::{bpe_pre_config, build_hf_bpe};
use super::special::{SpecialIds, SpecialMatcher, SpecialSlot, detect_specials};
use super::{
    FastMap, GgufTokenizer, KEY_ADD_BOS, KEY_ADD_EOS, KEY_ADD_SPACE_PREFIX, KEY_BOS_ID, KEY_EOM_ID,
    KEY_EOS_ID, KEY_EOT_ID, KEY_MERGES, KEY_MODEL, KEY_PAD_ID, KEY_PRE, KEY_SCORES, KEY_TOKEN_TYPE,
    KEY_TOKENS, KEY_UNK_ID, Result, TokenizerError, VocabType, attr, parse_byte_token,
};

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

/// Largest vocabulary accepted: llama.cpp token ids are `int32_t`.
const MAX_VOCAB: usize = i32::MAX as usize;

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

    pub(super) fn build(spec: VocabSpec<'_>) -> Result<Self> {
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
}

/// Everything `build` needs, read from the metadata.
pub(super) struct VocabSpec<'a> {
    pub(super) vocab_type: VocabType,
    pub(super) pre: Option<&'a str>,
    pub(super) tokens: &'a [String],
    pub(super) scores: Option<Vec<f32>>,
    pub(super) types: Option<&'a [i32]>,
    pub(super) merges: Option<&'a [String]>,
    pub(super) special_ids: Vec<(&'static str, SpecialSlot, u32)>,
    pub(super) add_bos: Option<bool>,
    pub(super) add_eos: Option<bool>,
    pub(super) add_space_prefix: Option<bool>,
    pub(super) model_name: Option<&'a str>,
}

fn key_type(key: &'static str, expected: &'static str, found: &MetadataValue) -> TokenizerError {
    TokenizerError::KeyType {
        key,
        expected,
        found: found.value_type_name(),
    }
}

/// An optional ARRAY[STRING] value.
pub(super) fn string_array<'a>(
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
pub(super) fn read_scores(
    value: Option<&MetadataValue>,
    n_tokens: usize,
) -> Result<Option<Vec<f32>>> {
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
pub(super) fn read_token_types(
    value: Option<&MetadataValue>,
    n_tokens: usize,
) -> Result<Option<&[i32]>> {
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
