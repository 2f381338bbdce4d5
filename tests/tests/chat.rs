//! Chat templates: the tiny Qwen3 fixture's `tokenizer.chat_template` as Transformers/Jinja2
//! renders it, the built-in ChatML for files without one, and case C25 (a Qwen3-style template
//! with `messages[::-1]`, `namespace`, `startswith`/`endswith` and `enable_thinking`; a
//! template's `raise_exception` fails the render with its message).
use burn_gguf_models::{ChatTemplate, GgufTokenizer, Message};
use burn_gguf_tests::fixtures;
use gguf::GgufFile;
use serde_json::json;

#[test]
fn fixture_template_renders_a_two_turn_conversation() {
    let file = GgufFile::open(fixtures().join("gguf/tiny-qwen3-Q8_0.gguf")).unwrap();
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap();
    assert!(!t.is_builtin());
    let messages = [
        Message::new("user", "Hello"),
        Message::new("assistant", "Hi there"),
        Message::new("user", "How are you?"),
    ];
    let out = t.render(&messages, true, &serde_json::Value::Null).unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n\
         <|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"
    );
    let out = t
        .render(&messages[..2], false, &serde_json::Value::Null)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
    );
}

/// A template in the style of Qwen3's: finds the last user turn walking `messages[::-1]` with a
/// `namespace`, tests roles and contents with Python string methods, and closes the thinking
/// block when `enable_thinking` is false.
const QWEN3_STYLE: &str = r#"{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == "user" and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.last_query_index = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content.strip() + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"#;

/// Mistral's role check: user and assistant must alternate.
const ALTERNATING: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == \
    'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate \
    user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' \
    + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}\
    {% endfor %}";

#[test]
fn c25_python_features_and_raise_exception() {
    let t = ChatTemplate::new(QWEN3_STYLE, "", "<|im_end|>").unwrap();
    let hi = [Message::new("user", "Hi")];
    let r1 = t.render(&hi, true, &serde_json::Value::Null).unwrap();
    assert_eq!(
        r1,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let r2 = t
        .render(&hi, true, &json!({"enable_thinking": false}))
        .unwrap();
    assert_eq!(r2, format!("{r1}<think>\n\n</think>\n\n"));

    let t = ChatTemplate::new(ALTERNATING, "<s>", "</s>").unwrap();
    let ok = t
        .render(
            &[Message::new("user", "a"), Message::new("assistant", "b")],
            false,
            &json!({}),
        )
        .unwrap();
    assert_eq!(ok, "<s>[INST] a [/INST]b</s>");
    let err = t
        .render(
            &[Message::new("user", "a"), Message::new("user", "b")],
            false,
            &json!({}),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Conversation roles must alternate user/assistant/user/assistant/..."),
        "{err}"
    );
}

#[test]
fn builtin_template_and_bad_templates() {
    let file = GgufFile::open(burn_gguf_tests::gemma_path()).unwrap();
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    // Gemma's file carries no template: the built-in Gemma one, after the BOS text.
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap();
    assert!(t.is_builtin());
    let out = t
        .render(
            &[Message::new("user", "Hi")],
            true,
            &serde_json::Value::Null,
        )
        .unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // C24: the template's BOS and the tokenizer's are one BOS, and the turn markers are single
    // special tokens.
    let ids = tok.encode_prompt(&out).unwrap();
    let bos = tok.bos_id().unwrap();
    assert_eq!(ids[0], bos);
    assert_ne!(ids[1], bos);
    assert_eq!(Some(ids[1]), tok.token_to_id("<start_of_turn>"));
    // A template that does not parse is an error at load, not at first use.
    assert!(ChatTemplate::new("{% for %}", "", "").is_err());
}

/// A second chat turn reuses the cached history: it prefills only the new tokens and gives the
/// same greedy reply as a fresh session over the whole rendered conversation. For Qwen3.5
/// (recurrent delta-net layers) the state goes back to its checkpoint after the first prompt.
#[test]
fn chat_session_reuses_the_history_cache() {
    for file in [
        "gguf/tiny-qwen3-Q8_0.gguf",
        "arch/tiny-qwen35-Q8_0.gguf",
        "arch/tiny-qwen35moe-Q4_K_M.gguf",
    ] {
        check_history_reuse(file);
    }
}

fn check_history_reuse(file: &str) {
    use burn_gguf::{GgufConfig, GgufLoader};
    use burn_gguf_models::{Decoder, Sampler, SamplerConfig, Session, generate_ids};
    let file = GgufFile::open(fixtures().join(file)).unwrap();
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap();
    let device = burn_gguf::default_device();
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let model = Decoder::load(&loader).unwrap();
    let greedy = || {
        Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        })
    };
    let mut session = Session::new(&model);
    let mut messages = vec![Message::new("user", "Hello world!")];
    let prompt = tok
        .encode_prompt(&t.render(&messages, true, &json!({})).unwrap())
        .unwrap();
    let first = generate_ids(&model, &tok, &mut session, prompt, 6, &mut greedy(), |_| {}).unwrap();
    messages.push(Message::new("assistant", first.text.trim()));
    messages.push(Message::new("user", "The capital of France is"));
    let prompt = tok
        .encode_prompt(&t.render(&messages, true, &json!({})).unwrap())
        .unwrap();
    let second = generate_ids(
        &model,
        &tok,
        &mut session,
        prompt.clone(),
        6,
        &mut greedy(),
        |_| {},
    )
    .unwrap();
    assert!(
        second.timings.prompt_tokens < prompt.len(),
        "{} of {} prompt tokens prefilled",
        second.timings.prompt_tokens,
        prompt.len()
    );
    let mut fresh = Session::new(&model);
    let again = generate_ids(
        &model,
        &tok,
        &mut fresh,
        prompt.clone(),
        6,
        &mut greedy(),
        |_| {},
    )
    .unwrap();
    assert_eq!(again.timings.prompt_tokens, prompt.len());
    assert_eq!(second.generated_ids, again.generated_ids);
}
