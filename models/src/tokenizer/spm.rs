//! SentencePiece tokenization (llama.cpp `LLAMA_VOCAB_TYPE_SPM`): a port of the bigram merge
//! of `llm_tokenizer_spm_session` in `src/llama-vocab.cpp`.

use std::collections::BinaryHeap;

use super::{GgufTokenizer, Result, TokenizerError};

impl GgufTokenizer {
    /// SentencePiece tokenization of one text fragment (llama.cpp `llm_tokenizer_spm_session`).
    ///
    /// llama.cpp runs one merge queue over the whole fragment. A merge joins two adjacent
    /// symbols into a token, so none can cross a `▁` whose preceding character never precedes
    /// `▁` inside a token; the pieces between such points merge independently and in the same
    /// order, so tokenizing them one by one gives the same ids with small queues.
    pub(super) fn spm_tokenize(
        &self,
        fragment: &str,
        prefix_space: bool,
        out: &mut Vec<u32>,
    ) -> Result<()> {
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
