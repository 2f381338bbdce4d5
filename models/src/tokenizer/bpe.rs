//! Byte-level BPE (llama.cpp `LLAMA_VOCAB_TYPE_BPE`, `llm_tokenizer_bpe` in
//! `src/llama-vocab.cpp`): the pre-tokenizer regexes selected by `tokenizer.ggml.pre`, the HF
//! `tokenizers` BPE model, and the GPT-2 byte-level mapping and space clean-up of `detokenize`.

use super::{GgufTokenizer, KEY_MERGES, KEY_PRE, Result, TokenizerError};

impl GgufTokenizer {
    /// Byte-level BPE tokenization of one text fragment with the HF `tokenizers` model.
    pub(super) fn bpe_tokenize(&self, fragment: &str, out: &mut Vec<u32>) -> Result<()> {
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

/// llama.cpp's `clean_spaces` passes of `detokenize` (like `clean_up_tokenization_spaces`),
/// ported in place as written there.
pub(super) fn clean_up_spaces(text: &mut Vec<u8>) {
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
pub(super) fn byte_level_decode(text: &str, out: &mut Vec<u8>) {
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
pub(super) struct PreConfig {
    regexes: &'static [&'static str],
    ignore_merges: bool,
    pub(super) add_bos: bool,
    /// Overrides the BPE default `clean_spaces = true`.
    pub(super) clean_spaces: Option<bool>,
    /// The pre-tokenizer clears the BOS id (chatglm).
    pub(super) no_bos: bool,
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
pub(super) fn bpe_pre_config(pre: Option<&str>) -> Result<PreConfig> {
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
pub(super) fn build_hf_bpe(
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
    fn byte_level_table_is_gpt2() {
        let t = byte_to_char();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
    }
}
