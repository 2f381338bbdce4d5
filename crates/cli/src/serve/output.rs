//! What the worker writes about generated tokens besides their ids: log-probabilities read
//! back from the device ([`logprobs`]) and where stop strings cut the text ([`first_stop`],
//! [`held_back`]).

use burn::tensor::Tensor;
use burn_gguf_models::GgufTokenizer;

use super::engine::MAX_TOP_LOGPROBS;

/// One candidate token and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (lossy where its bytes are part of a character).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability under the model's distribution (the softmax of the
    /// logits, before temperature or truncation).
    pub logprob: f32,
}

/// The log-probability of a generated token and of the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    /// The generated token.
    pub chosen: TokenLogprob,
    /// The `top_logprobs` most likely tokens, most likely first.
    pub top: Vec<TokenLogprob>,
}

/// The log-probability of `token` and the `k` most likely tokens under `logits` `[1, vocab]`:
/// the log-softmax and the selection run on the device; `k + 1` values come back.
pub fn logprobs(
    tokenizer: &GgufTokenizer,
    logits: Tensor<2>,
    token: u32,
    k: usize,
) -> Result<Logprobs, String> {
    fn read(e: impl std::fmt::Debug) -> String {
        format!("{e:?}")
    }
    let lp = burn::tensor::activation::log_softmax(logits, 1);
    let t = token as usize;
    let chosen = lp
        .clone()
        .slice([0..1, t..t + 1])
        .try_into_data()
        .map_err(read)?
        .iter::<f32>()
        .next()
        .unwrap_or(f32::NEG_INFINITY);
    let entry = |id: u32, logprob: f32| {
        let bytes = tokenizer.token_bytes(id, true).unwrap_or_default();
        TokenLogprob {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob,
        }
    };
    let mut top = Vec::new();
    if k > 0 {
        let (values, ids) = burn_gguf::top_k(lp, k.min(MAX_TOP_LOGPROBS));
        let values = values.try_into_data().map_err(read)?;
        let ids = ids.try_into_data().map_err(read)?;
        top = values
            .iter::<f32>()
            .zip(ids.iter::<i64>())
            .filter(|&(_, id)| id as u32 != burn_gguf::sampling::NO_ID)
            .map(|(v, id)| entry(id as u32, v))
            .collect();
    }
    Ok(Logprobs {
        chosen: entry(token, chosen),
        top,
    })
}

/// Byte offset of the first occurrence of any stop string in `text`.
pub fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

/// Length of the longest tail of `text` that is a proper prefix of a stop string (at a char
/// boundary): text that may still turn into a stop string and must not be sent yet.
pub fn held_back(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for s in stops {
        for (k, _) in s.char_indices().skip(1) {
            if k > best && text.ends_with(&s[..k]) {
                best = k;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_and_hold_back() {
        let stops = vec!["</end>".to_string(), "\n\n".to_string()];
        assert_eq!(first_stop("abc</end>x", &stops), Some(3));
        assert_eq!(first_stop("a\n\nb</end>", &stops), Some(1));
        assert_eq!(first_stop("abc", &stops), None);
        assert_eq!(held_back("abc</e", &stops), 3);
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
        // Multi-byte characters: only char boundaries of the stop string count.
        let stops = vec!["é!".to_string()];
        assert_eq!(held_back("caf\u{e9}", &stops), 2);
    }
}
