//! Fine-tuning LoRA adapters over a packed model (DESIGN decision 10): the base weights stay
//! ggml blocks on the device and get no gradient; the loss's gradient reaches the adapters
//! through the packed products' backward passes (`dx = dy W` from the blocks,
//! [`burn_gguf::autodiff`]). Data is plain text (a causal LM over the whole text, in windows
//! of `seq_len + 1` tokens) or chat conversations (loss on the assistant's tokens only), and
//! the optimizer is Burn's AdamW with gradient accumulation over a batch of sequences.
//!
//! ```no_run
//! use burn_gguf::{GgufConfig, GgufLoader, LoraConfig};
//! use burn_gguf_models::finetune::{FineTune, TrainConfig, text_examples};
//! use burn_gguf_models::{Decoder, DecoderLora, GgufTokenizer};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = gguf::GgufFile::open("model.gguf")?;
//! let device = burn_gguf::default_device().autodiff(); // gradients on the wgpu device
//! let model = Decoder::load(&GgufLoader::new(&file, &device, GgufConfig::default()))?;
//! let tokenizer = GgufTokenizer::from_gguf(&file)?;
//! let data = text_examples(&tokenizer, "The text to learn.", 256)?;
//! let lora = DecoderLora::new(&model, &LoraConfig::default(), &device)?;
//! let mut run = FineTune::new(&model, lora, TrainConfig::default());
//! for _ in 0..100 {
//!     let stats = run.step(&data)?;
//!     println!("loss {:.3}", stats.loss);
//! }
//! run.lora().to_gguf(&model.config().architecture)?.write("adapter.gguf")?;
//! # Ok(()) }
//! ```
use crate::Error;
use crate::chat::{ChatTemplate, Message};
use crate::decoder::Decoder;
use crate::lora::DecoderLora;
use crate::state::BatchState;
use crate::tokenizer::GgufTokenizer;
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Int, Tensor, TensorData};
use std::time::Instant;

/// One training sequence: token ids and which of them the loss predicts.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// The tokens, at most `seq_len + 1` of them (`seq_len` predictions).
    pub ids: Vec<u32>,
    /// `target[i]`: whether token `i` (for `i >= 1`) is predicted from those before it.
    pub target: Vec<bool>,
}

impl Example {
    /// Tokens the loss predicts.
    pub fn targets(&self) -> usize {
        self.target.iter().skip(1).filter(|&&t| t).count()
    }
}

/// Hyper-parameters of a fine-tuning run (AdamW, a constant learning rate).
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// Learning rate.
    pub lr: f64,
    /// Sequences per forward pass (one pass over all of them, each in its own slot).
    pub batch: usize,
    /// Passes per optimizer step, their gradients accumulated: an effective batch of
    /// `batch * grad_accum` sequences.
    pub grad_accum: usize,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f32,
    /// Seed of the order the examples are taken in.
    pub seed: u64,
}

impl Default for TrainConfig {
    /// Learning rate 1e-4, batch 1, no accumulation, no weight decay, seed 0.
    fn default() -> Self {
        Self {
            lr: 1e-4,
            batch: 1,
            grad_accum: 1,
            weight_decay: 0.0,
            seed: 0,
        }
    }
}

/// Windows of a plain text for a causal LM: the text tokenized once (with BOS where the model
/// adds one), cut into windows of `seq_len + 1` tokens that overlap by one, every token after
/// the first a target.
///
/// # Errors
/// [`Error::Model`] for `seq_len` 0 or a text of fewer than two tokens; tokenizer errors.
pub fn text_examples(
    tokenizer: &GgufTokenizer,
    text: &str,
    seq_len: usize,
) -> Result<Vec<Example>, Error> {
    if seq_len == 0 {
        return Err(Error::Model(
            "seq-len 0: a sequence needs at least 1 token".into(),
        ));
    }
    let ids = tokenizer.encode(text, true)?;
    if ids.len() < 2 {
        return Err(Error::Model(format!(
            "the text is {} token(s): at least 2 are needed to predict one",
            ids.len()
        )));
    }
    Ok((0..ids.len() - 1)
        .step_by(seq_len)
        .map(|start| {
            let end = (start + seq_len + 1).min(ids.len());
            let ids = ids[start..end].to_vec();
            let target = vec![true; ids.len()];
            Example { ids, target }
        })
        .collect())
}

/// Conversations of a JSONL file (one `{"messages": [{"role": ..., "content": ...}, ...]}`
/// per line, blank lines skipped) rendered with the model's chat template; the loss is on the
/// assistant's tokens only (each assistant message's tokens, as the template renders its turn,
/// up to its end-of-turn marker). A conversation longer than `seq_len + 1` tokens is cut.
///
/// # Errors
/// [`Error::Model`] naming the line for a line that does not parse, has no `messages`, or has no
/// assistant message; template and tokenizer errors.
pub fn chat_examples(
    tokenizer: &GgufTokenizer,
    template: &ChatTemplate,
    jsonl: &str,
    seq_len: usize,
) -> Result<Vec<Example>, Error> {
    #[derive(serde::Deserialize)]
    struct Line {
        messages: Vec<Message>,
    }
    if seq_len == 0 {
        return Err(Error::Model(
            "seq-len 0: a sequence needs at least 1 token".into(),
        ));
    }
    let none = serde_json::Value::Null;
    let mut out = Vec::new();
    for (i, line) in jsonl.lines().enumerate() {
        let at = |what: String| Error::Model(format!("line {}: {what}", i + 1));
        if line.trim().is_empty() {
            continue;
        }
        let Line { messages } =
            serde_json::from_str(line).map_err(|e| at(format!("not a chat example: {e}")))?;
        if !messages.iter().any(|m| m.role == "assistant") {
            return Err(at("no assistant message to learn".into()));
        }
        // The tokens of the conversation up to each message; an assistant message's tokens are
        // those its own turn adds after the prompt that opens it.
        let full = tokenizer.encode_prompt(
            &template
                .render(&messages, false, &none)
                .map_err(|e| at(format!("chat template: {e}")))?,
        )?;
        let mut target = vec![false; full.len()];
        for (k, m) in messages.iter().enumerate() {
            if m.role != "assistant" {
                continue;
            }
            let render = |msgs: &[Message], open: bool| -> Result<Vec<u32>, Error> {
                let text = template
                    .render(msgs, open, &none)
                    .map_err(|e| at(format!("chat template: {e}")))?;
                Ok(tokenizer.encode_prompt(&text)?)
            };
            let start = common_prefix(&render(&messages[..k], true)?, &full);
            let end = common_prefix(&render(&messages[..=k], false)?, &full);
            for t in target.iter_mut().take(end).skip(start) {
                *t = true;
            }
        }
        let keep = full.len().min(seq_len + 1);
        let ex = Example {
            ids: full[..keep].to_vec(),
            target: target[..keep].to_vec(),
        };
        if ex.targets() > 0 {
            out.push(ex);
        }
    }
    if out.is_empty() {
        return Err(Error::Model(
            "no conversation with an assistant token to learn".into(),
        ));
    }
    Ok(out)
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The mean cross-entropy of `ex`'s targets under `model` with `lora`: a scalar `[1]`, tracked
/// where the model's device has autodiff ([`batch_loss`] of one example).
///
/// # Errors
/// As [`batch_loss`].
pub fn sequence_loss(
    model: &Decoder,
    lora: Option<&DecoderLora>,
    ex: &Example,
) -> Result<Tensor<1>, Error> {
    batch_loss(model, lora, &[ex])
}

/// The mean cross-entropy over every target token of `batch`, the sequences run in one pass
/// (each in its own slot): a scalar `[1]`, tracked where the model's device has autodiff. The vocabulary is taken a piece of the head at a time
/// ([`Decoder::head_chunks`]): each piece's logits give a log-sum-exp per row, and the pieces'
/// combine into the softmax's normaliser, so neither `[tokens, vocab]` logits nor a dense head
/// exist at once, and the backward pass dequantizes each piece of the head once.
///
/// # Errors
/// No example, an example of fewer than 2 tokens or without a target, or a forward-pass error
/// (a sequence past the context).
pub fn batch_loss(
    model: &Decoder,
    lora: Option<&DecoderLora>,
    batch: &[&Example],
) -> Result<Tensor<1>, Error> {
    if batch.is_empty() || batch.iter().any(|ex| ex.ids.len() < 2 || ex.targets() == 0) {
        return Err(Error::Model("a training sequence without a target".into()));
    }
    let count: usize = batch.iter().map(|ex| ex.targets()).sum();
    let device = model.device().clone();
    let seqs: Vec<(usize, &[u32])> = (batch.iter().enumerate())
        .map(|(slot, ex)| (slot, &ex.ids[..ex.ids.len() - 1]))
        .collect();
    let mut state = BatchState::new(batch.len());
    let h = model.forward_hidden_batch(&mut state, &seqs, lora)?;
    // Only the rows whose next token is a target, and those tokens.
    let (mut rows, mut next) = (Vec::new(), Vec::new());
    let mut at = 0;
    for ex in batch {
        for i in 0..ex.ids.len() - 1 {
            if ex.target[i + 1] {
                rows.push(at + i);
                next.push(ex.ids[i + 1]);
            }
        }
        at += ex.ids.len() - 1;
    }
    let n = at;
    let h = if rows.len() == n {
        h
    } else {
        let at: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        h.select(
            0,
            Tensor::<1, Int>::from_data(TensorData::new(at, [rows.len()]), &device),
        )
    };
    let lse: Vec<Tensor<2>> = model
        .head_chunks()
        .into_iter()
        .map(|(first, len)| log_sum_exp(model.logits_rows(h.clone(), first, len)))
        .collect();
    let lse = match lse.len() {
        1 => lse.into_iter().next().expect("one piece"),
        _ => log_sum_exp(Tensor::cat(lse, 1)),
    };
    let target = model.target_logits(h, &next)?;
    Ok((lse - target).sum().reshape([1]) / count as f64)
}

/// `log(sum(exp(x)))` over each row of `x` `[m, n]`: `[m, 1]`, shifted by the row's maximum
/// (a constant for the gradient) so nothing overflows.
fn log_sum_exp(x: Tensor<2>) -> Tensor<2> {
    let max = x.clone().max_dim(1).detach();
    (x - max.clone()).exp().sum_dim(1).log() + max
}

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepStats {
    /// The batch's mean loss (per target token).
    pub loss: f32,
    /// Tokens the batch's forward passes ran (inputs, not only targets).
    pub tokens: usize,
    /// Wall time of the step, forward, backward and update, in seconds.
    pub seconds: f64,
}

/// A fine-tuning run: `lora` over a frozen `model`, trained by AdamW. [`FineTune::step`] takes
/// the next `batch` examples of a list in a seeded order and updates the adapters once.
pub struct FineTune<'a> {
    model: &'a Decoder,
    lora: Option<DecoderLora>,
    optim: ModuleOptimizer,
    config: TrainConfig,
    order: Vec<usize>,
    next: usize,
    rng: u64,
    steps: usize,
}

impl<'a> FineTune<'a> {
    /// A run training `lora` (on `model`'s autodiff device) with `config`.
    pub fn new(model: &'a Decoder, lora: DecoderLora, config: TrainConfig) -> Self {
        let optim = AdamWConfig::new()
            .with_weight_decay(config.weight_decay)
            .init();
        let rng = config.seed ^ 0x9e37_79b9_7f4a_7c15;
        Self {
            model,
            lora: Some(lora),
            optim,
            config,
            order: Vec::new(),
            next: 0,
            rng,
            steps: 0,
        }
    }

    /// The adapters as trained so far.
    pub fn lora(&self) -> &DecoderLora {
        self.lora
            .as_ref()
            .expect("the adapters are put back after every step")
    }

    /// The adapters, ending the run.
    pub fn into_lora(self) -> DecoderLora {
        self.lora
            .expect("the adapters are put back after every step")
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// One optimizer step over the next `batch * grad_accum` examples of `data` (taken in a
    /// seeded order, reshuffled after each pass over the data): `grad_accum` passes of
    /// `batch` sequences, their gradients accumulated.
    ///
    /// # Errors
    /// No example, a forward-pass error, or [`Error::Model`] when the loss is not finite (the
    /// adapters keep their values from before the step).
    pub fn step(&mut self, data: &[Example]) -> Result<StepStats, Error> {
        if data.is_empty() {
            return Err(Error::Model("no training example".into()));
        }
        let t0 = Instant::now();
        let (batch, passes) = (self.config.batch.max(1), self.config.grad_accum.max(1));
        let picked: Vec<usize> = (0..batch * passes)
            .map(|_| self.next_index(data.len()))
            .collect();
        let lora = self
            .lora
            .as_ref()
            .expect("the adapters are put back after every step");
        let mut acc = GradientsAccumulator::<DecoderLora>::new();
        let (mut loss_sum, mut tokens) = (0.0f64, 0usize);
        for pass in picked.chunks(batch) {
            let examples: Vec<&Example> = pass.iter().map(|&i| &data[i]).collect();
            let loss = batch_loss(self.model, Some(lora), &examples)?;
            let value = crate::host_f32(loss.clone())?[0];
            if !value.is_finite() {
                return Err(Error::Model(format!(
                    "the loss is {value} at step {}: training stopped (the adapters keep \
                     their last finite values)",
                    self.steps + 1
                )));
            }
            loss_sum += f64::from(value);
            tokens += examples.iter().map(|ex| ex.ids.len() - 1).sum::<usize>();
            let grads = (loss / passes as f64).backward();
            acc.accumulate(lora, GradientsParams::from_grads(grads, lora));
        }
        let lora = self
            .lora
            .take()
            .expect("the adapters are put back after every step");
        self.lora = Some(self.optim.step(self.config.lr, lora, acc.grads()));
        self.steps += 1;
        Ok(StepStats {
            loss: (loss_sum / passes as f64) as f32,
            tokens,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// The mean loss per target token over all of `data` with the adapters as trained so far,
    /// in passes of `batch` sequences (no optimizer step): the figure that shows a run learnt.
    ///
    /// # Errors
    /// As [`batch_loss`].
    pub fn eval_loss(&self, data: &[Example]) -> Result<f32, Error> {
        let (mut sum, mut count) = (0f64, 0usize);
        for pass in data.chunks(self.config.batch.max(1)) {
            let examples: Vec<&Example> = pass.iter().collect();
            let targets: usize = examples.iter().map(|ex| ex.targets()).sum();
            let loss = crate::host_f32(batch_loss(self.model, Some(self.lora()), &examples)?)?[0];
            sum += f64::from(loss) * targets as f64;
            count += targets;
        }
        Ok((sum / count.max(1) as f64) as f32)
    }

    /// The next example's index: a Fisher-Yates shuffle of `0..len` per pass (splitmix64).
    fn next_index(&mut self, len: usize) -> usize {
        if self.next >= self.order.len() || self.order.len() != len {
            self.order = (0..len).collect();
            for i in (1..len).rev() {
                let j = (self.rand() % (i as u64 + 1)) as usize;
                self.order.swap(i, j);
            }
            self.next = 0;
        }
        self.next += 1;
        self.order[self.next - 1]
    }

    fn rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
