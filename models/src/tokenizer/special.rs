//! Special tokens: the special-token ids llama.cpp tracks (`special_*_id`), their detection
//! by text with the end-of-generation set (`llama_vocab::impl::load` in `src/llama-vocab.cpp`),
//! and the matcher that finds them in text for `tokenizer_st_partition`.

use std::collections::HashSet;

use super::{FastMap, attr};

/// The slots of special tokens that llama.cpp tracks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SpecialSlot {
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
pub(super) struct SpecialIds {
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) eot: Option<u32>,
    eom: Option<u32>,
    pub(super) unk: Option<u32>,
    sep: Option<u32>,
    pub(super) pad: Option<u32>,
    mask: Option<u32>,
    fim_pre: Option<u32>,
    fim_suf: Option<u32>,
    fim_mid: Option<u32>,
    fim_pad: Option<u32>,
    fim_rep: Option<u32>,
    fim_sep: Option<u32>,
}

impl SpecialIds {
    pub(super) fn slot(&mut self, slot: SpecialSlot) -> &mut Option<u32> {
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
/// [`GgufTokenizer::is_eog`](super::GgufTokenizer::is_eog)) and Gemma 4's tokens.
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
pub(super) fn detect_specials(
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
pub(super) struct SpecialMatcher {
    /// Special token ids, longest text first (ties by id).
    order: Vec<u32>,
    /// Text of each special token to its position in `order`.
    by_text: FastMap<String, usize>,
    /// For each first byte, the distinct lengths of special texts starting with it.
    lens_by_first_byte: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    pub(super) fn new(tokens: &[String], order: Vec<u32>) -> Self {
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
    pub(super) fn candidates(&self, text: &str) -> Vec<u32> {
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
