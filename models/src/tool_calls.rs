//! Tool (function) calls in chat templates' own syntax: which syntax a template uses
//! ([`ToolCallFormat::detect`]), the calls in a model's reply ([`ToolCallFormat::parse`]), and,
//! with the `structured` feature, a grammar that makes the reply one valid call
//! ([`ToolCallFormat::grammar`]).
//!
//! The syntaxes are those of the templates the supported architectures ship with:
//! - [`ToolCallFormat::Hermes`]: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
//!   one block per call (Qwen2.5, Qwen3, Hermes 2/3; `<tool_call>` in the template).
//! - [`ToolCallFormat::QwenXml`]: `<tool_call>` holding `<function=NAME>`, one
//!   `<parameter=KEY>VALUE</parameter>` per argument, `</function>` and `</tool_call>`, each on
//!   its own line (Qwen3.5, Qwen3-Coder; `<function=` in the template).
//! - [`ToolCallFormat::Llama3`]: a bare JSON object `{"name": ..., "parameters": {...}}`, after
//!   `<|python_tag|>` or not (Llama 3.1-3.3; `<|start_header_id|>` and `tools` in the template):
//!   a reply from its first `{` on is read as calls (content if it does not parse).
//! - [`ToolCallFormat::Mistral`]: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the
//!   newer `[TOOL_CALLS]NAME[ARGS]{...}` (Mistral; `[TOOL_CALLS]` in the template).
//!
//! Calls are read from text decoded with control tokens as text (`<|python_tag|>` and
//! `[TOOL_CALLS]` are control tokens in their vocabularies).
use serde_json::{Map, Value, json};

/// Most tools one request may declare.
pub const MAX_TOOLS: usize = 128;

/// A tool (function) a request declares: OpenAI `{"type": "function", "function": {...}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// The function's name: 1 to 64 of `a-z A-Z 0-9 _ -`.
    pub name: String,
    /// Its description, if any.
    pub description: Option<String>,
    /// The JSON schema of its arguments (an object schema; `{"type": "object"}` when absent).
    pub parameters: Value,
}

impl Tool {
    /// The OpenAI form templates receive in their `tools` variable, as Transformers passes it.
    pub fn to_template_value(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), self.name.clone().into());
        if let Some(d) = &self.description {
            f.insert("description".into(), d.clone().into());
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({ "type": "function", "function": Value::Object(f) })
    }
}

/// A call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments (a JSON object when the model wrote one).
    pub arguments: Value,
}

/// The tool-call syntax of a chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>` blocks of JSON (`name`, `arguments`).
    Hermes,
    /// `<tool_call>` blocks of `<function=...>` and `<parameter=...>` tags.
    QwenXml,
    /// A JSON object (`name`, `parameters`), optionally after `<|python_tag|>`.
    Llama3,
    /// `[TOOL_CALLS]` and a JSON list, or `NAME[ARGS]{...}`.
    Mistral,
}

impl ToolCallFormat {
    /// The syntax `template` (a chat template's source) writes tool calls in; `None` when it
    /// takes no tools (it never reads a `tools` variable, or writes calls no way known here).
    pub fn detect(template: &str) -> Option<Self> {
        if !template.contains("tools") {
            return None;
        }
        if template.contains("<function=") {
            Some(Self::QwenXml)
        } else if template.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(Self::Mistral)
        } else if template.contains("<|start_header_id|>") {
            Some(Self::Llama3)
        } else {
            None
        }
    }

    /// Text that starts a call: a reply is content until one of these appears.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            Self::Hermes | Self::QwenXml => &["<tool_call>"],
            Self::Llama3 => &["<|python_tag|>", "{"],
            Self::Mistral => &["[TOOL_CALLS]"],
        }
    }

    /// Splits a whole reply into content (the text before the first call, without trailing
    /// whitespace; `None` when blank) and the calls. A reply whose call text does not parse is
    /// all content, as written. `tools` are the request's: [`ToolCallFormat::QwenXml`] reads a
    /// parameter's value by the type its tool declares (a string parameter's value is its
    /// text, as Qwen's own parser reads it).
    pub fn parse(self, text: &str, tools: &[Tool]) -> (Option<String>, Vec<ToolCall>) {
        let start = self.markers().iter().filter_map(|m| text.find(m)).min();
        let calls = match start {
            None => Vec::new(),
            Some(at) => {
                let body = &text[at..];
                match self {
                    Self::Hermes => blocks(body, "<tool_call>", "</tool_call>")
                        .iter()
                        .map(|b| json_call(b, "arguments"))
                        .collect::<Option<Vec<_>>>()
                        .unwrap_or_default(),
                    Self::QwenXml => blocks(body, "<tool_call>", "</tool_call>")
                        .iter()
                        .map(|b| xml_call(b, tools))
                        .collect::<Option<Vec<_>>>()
                        .unwrap_or_default(),
                    Self::Llama3 => {
                        let b = body.trim_start_matches("<|python_tag|>").trim();
                        let one = |c: &str| {
                            json_call(c, "parameters").or_else(|| json_call(c, "arguments"))
                        };
                        // One call, or several separated by `;`.
                        match one(b) {
                            Some(c) => vec![c],
                            None => b
                                .split(';')
                                .map(one)
                                .collect::<Option<Vec<_>>>()
                                .unwrap_or_default(),
                        }
                    }
                    Self::Mistral => mistral_calls(body["[TOOL_CALLS]".len()..].trim()),
                }
            }
        };
        // Before calls, trailing whitespace is the calls' separator; a reply with no call is
        // all content, as written.
        let content = match (start, calls.is_empty()) {
            (Some(at), false) => text[..at].trim_end(),
            _ => text,
        };
        let content = (!content.trim().is_empty()).then(|| content.to_string());
        (content, calls)
    }
}

/// The insides of every `open ... close` block of `text` (the last one may be unclosed).
fn blocks<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(open) {
        let inner = &rest[at + open.len()..];
        match inner.find(close) {
            Some(end) => {
                out.push(inner[..end].trim());
                rest = &inner[end + close.len()..];
            }
            None => {
                out.push(inner.trim());
                break;
            }
        }
    }
    out
}

/// A JSON object `{"name": ..., args_key: {...}}` as a call (arguments given as a JSON string
/// are read as JSON).
fn json_call(text: &str, args_key: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get(args_key)? {
        Value::String(s) => serde_json::from_str(s).ok()?,
        other => other.clone(),
    };
    arguments
        .is_object()
        .then_some(ToolCall { name, arguments })
}

/// A `<function=NAME>` block with `<parameter=KEY>VALUE</parameter>` children, read as Qwen's
/// own parser (vLLM's `qwen3_coder`) reads them: the value of a parameter the named tool of
/// `tools` declares a string ([`is_string_param`]) is the raw text; any other value that parses
/// as JSON (a number, `true`, a list) is that JSON, else the raw text.
fn xml_call(text: &str, tools: &[Tool]) -> Option<ToolCall> {
    let rest = text.trim().strip_prefix("<function=")?;
    let end = rest.find('>')?;
    let name = rest[..end].trim().to_string();
    let props = (tools.iter().find(|t| t.name == name))
        .and_then(|t| t.parameters.get("properties"))
        .and_then(Value::as_object);
    let mut args = Map::new();
    for p in blocks(&rest[end + 1..], "<parameter=", "</parameter>") {
        let close = p.find('>')?;
        let key = p[..close].trim().to_string();
        let raw = p[close + 1..].trim_matches('\n');
        let text = props.and_then(|p| p.get(&key)).is_some_and(is_string_param);
        let value = (!text)
            .then(|| serde_json::from_str::<Value>(raw).ok())
            .flatten()
            .filter(|v| !v.is_string())
            .unwrap_or_else(|| Value::String(raw.to_string()));
        args.insert(key, value);
    }
    (!name.is_empty()).then_some(ToolCall {
        name,
        arguments: Value::Object(args),
    })
}

/// Mistral's calls after `[TOOL_CALLS]`: a JSON list of `{"name", "arguments"}`, or
/// `NAME[ARGS]{...}` repeated (each after its own `[TOOL_CALLS]`).
fn mistral_calls(text: &str) -> Vec<ToolCall> {
    if let Ok(Value::Array(list)) = serde_json::from_str::<Value>(text) {
        return list
            .iter()
            .map(|c| json_call(&c.to_string(), "arguments"))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
    }
    text.split("[TOOL_CALLS]")
        .map(|c| {
            let (name, args) = c.split_once("[ARGS]")?;
            let arguments: Value = serde_json::from_str(args.trim()).ok()?;
            arguments.is_object().then(|| ToolCall {
                name: name.trim().to_string(),
                arguments,
            })
        })
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default()
}

#[cfg(feature = "structured")]
impl ToolCallFormat {
    /// A grammar whose every match is exactly one call, in this syntax, of one of `tools`, with
    /// arguments valid under its parameters schema (for `tool_choice` `required` or a named
    /// function: pass only that one). `special_id` gives the id of a control token the syntax
    /// needs (`[TOOL_CALLS]`).
    ///
    /// # Errors
    /// A message when a needed control token is not in the vocabulary, or (for
    /// [`ToolCallFormat::QwenXml`], whose string values are raw text) a parameter whose schema
    /// raw text cannot be kept to here: a string under `pattern` or `format`, no single type.
    pub fn grammar(
        self,
        tools: &[Tool],
        special_id: impl Fn(&str) -> Option<u32>,
    ) -> Result<crate::structured::Grammar, String> {
        let call = |args_key: &str| {
            let options: Vec<Value> = tools
                .iter()
                .map(|t| {
                    json!({
                        "type": "object",
                        "properties": { "name": { "const": t.name }, args_key: t.parameters },
                        "required": ["name", args_key],
                        "additionalProperties": false
                    })
                })
                .collect();
            json!({ "anyOf": options })
        };
        // llguidance reads its options at the top of a `%json` schema: JSON whitespace bounded
        // as in `structured`.
        let bounded = |mut schema: Value| {
            schema["x-guidance"] = crate::structured::json_options();
            schema
        };
        let lark = match self {
            Self::Hermes => format!(
                "start: \"<tool_call>\\n\" %json {} \"\\n</tool_call>\"",
                bounded(call("arguments"))
            ),
            Self::Llama3 => format!("start: %json {}", bounded(call("parameters"))),
            Self::Mistral => {
                let id =
                    special_id("[TOOL_CALLS]").ok_or("the vocabulary has no [TOOL_CALLS] token")?;
                let list = bounded(json!({ "type": "array", "items": call("arguments"),
                                           "minItems": 1, "maxItems": 1 }));
                format!("start: <[{id}]> %json {list}")
            }
            Self::QwenXml => qwen_xml_grammar(tools, bounded)?,
        };
        Ok(crate::structured::Grammar::Lark(lark))
    }
}

/// Longest raw-text value of a string parameter in a forced [`ToolCallFormat::QwenXml`] call,
/// in characters (a `maxLength` lowers it).
#[cfg(feature = "structured")]
const XML_TEXT_MAX: usize = 256;

/// The Lark grammar of one `<function=NAME>` call of one of `tools`, written as Qwen3.5's
/// template writes calls and read back as [`xml_call`] reads them: a string parameter's value
/// as raw text (printable ASCII without `<`, `minLength` to `maxLength` characters, at most
/// [`XML_TEXT_MAX`]; an `enum` or `const` of strings as those strings), any other parameter's
/// as JSON under its schema (`%json`, bounded by `bounded`). Required parameters are written,
/// optional ones may be, in the schema's order.
///
/// # Errors
/// A parameter name other than letters, digits, `_`, `-` and `.`, a required parameter without
/// a schema, or a schema that could be a string under other constraints (`pattern`, `format`,
/// a list of types, no type): raw text cannot be kept to those here.
#[cfg(feature = "structured")]
fn qwen_xml_grammar(tools: &[Tool], bounded: impl Fn(Value) -> Value) -> Result<String, String> {
    let mut rules = Vec::new();
    let mut calls = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let props = t.parameters.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = (t.parameters.get("required").and_then(Value::as_array))
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(missing) =
            (required.iter()).find(|k| props.is_none_or(|p| !p.contains_key(**k)))
        {
            return Err(format!(
                "tool '{}': required parameter '{missing}' has no schema",
                t.name
            ));
        }
        // Tool names are letters, digits, `_` and `-` (checked when a request is read).
        let mut body = format!("\"<function={}>\\n\"", t.name);
        for (j, (key, schema)) in props.into_iter().flatten().enumerate() {
            let plain = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
            if key.is_empty() || !key.chars().all(plain) {
                return Err(format!(
                    "tool '{}': parameter name {key:?} cannot be written in a <parameter=...> \
                     tag (letters, digits, _, - and . only)",
                    t.name
                ));
            }
            let value = xml_value(schema, &bounded)
                .map_err(|why| format!("tool '{}', parameter '{key}': {why}", t.name))?;
            rules.push(format!(
                "p{i}_{j}: \"<parameter={key}>\\n\" {value} \"\\n</parameter>\\n\""
            ));
            let optional = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            body.push_str(&format!(" p{i}_{j}{optional}"));
        }
        body.push_str(" \"</function>\\n\"");
        rules.push(format!("f{i}: {body}"));
        calls.push(format!("f{i}"));
    }
    let start = format!(
        "start: \"<tool_call>\\n\" ({}) \"</tool_call>\"",
        calls.join(" | ")
    );
    Ok(std::iter::once(start)
        .chain(rules)
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The Lark expression of one parameter's value in a forced [`ToolCallFormat::QwenXml`] call
/// (see [`qwen_xml_grammar`]), or why there is none.
#[cfg(feature = "structured")]
fn xml_value(schema: &Value, bounded: &impl Fn(Value) -> Value) -> Result<String, String> {
    if let Some(list) = string_choices(schema) {
        let texts: Option<Vec<String>> = (list.iter())
            .map(|v| {
                let s = v
                    .as_str()
                    .filter(|s| !s.is_empty() && !s.contains(['<', '\n']))?;
                Some(serde_json::to_string(s).expect("a string serializes"))
            })
            .collect();
        return match texts {
            Some(t) => Ok(format!("({})", t.join(" | "))),
            None => Err(
                "an enum of strings and other values, or of strings holding '<' or a \
                         line break"
                    .into(),
            ),
        };
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => {
            let allowed = [
                "type",
                "description",
                "title",
                "minLength",
                "maxLength",
                "default",
                "examples",
            ];
            let keys = schema.as_object().into_iter().flatten().map(|(k, _)| k);
            if let Some(k) = keys.into_iter().find(|k| !allowed.contains(&k.as_str())) {
                return Err(format!("a string with '{k}' is not kept to as raw text"));
            }
            let bound = |k: &str| schema.get(k).and_then(Value::as_u64).map(|v| v as usize);
            let min = bound("minLength").unwrap_or(0);
            let max = bound("maxLength").unwrap_or(XML_TEXT_MAX).min(XML_TEXT_MAX);
            if min > max {
                return Err(format!(
                    "minLength {min} is past the {max} characters written"
                ));
            }
            // Printable ASCII but `<` (which could start `</parameter>`).
            Ok(format!("/[\\x20-\\x3B\\x3D-\\x7E]{{{min},{max}}}/"))
        }
        Some(_) => Ok(format!("%json {}", bounded(schema.clone()))),
        None => Err(
            "a schema without one type could be a string, which this syntax writes \
                     as raw text"
                .into(),
        ),
    }
}

/// The strings a schema allows when it is an `enum` or `const` holding a string (the parser
/// keeps such a value as raw text).
fn string_choices(schema: &Value) -> Option<&[Value]> {
    let list: &[Value] = match (schema.get("enum"), schema.get("const")) {
        (Some(Value::Array(l)), _) => l,
        (_, Some(c)) => std::slice::from_ref(c),
        _ => return None,
    };
    list.iter().any(Value::is_string).then_some(list)
}

/// Whether a parameter of `schema` is a string: its value is kept as raw text, as Qwen's own
/// parser does (`"type": "string"`, or an `enum` or `const` holding a string).
fn is_string_param(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("string") || string_choices(schema).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_the_templates_syntax() {
        assert_eq!(ToolCallFormat::detect("{{ messages }}"), None);
        assert_eq!(
            ToolCallFormat::detect("{% if tools %}<tool_call>{% endif %}"),
            Some(ToolCallFormat::Hermes)
        );
        assert_eq!(
            ToolCallFormat::detect("{% if tools %}<tool_call><function=x>{% endif %}"),
            Some(ToolCallFormat::QwenXml)
        );
        assert_eq!(
            ToolCallFormat::detect("{% if tools %}[TOOL_CALLS]{% endif %}"),
            Some(ToolCallFormat::Mistral)
        );
        assert_eq!(
            ToolCallFormat::detect("<|start_header_id|>{% if tools %}{% endif %}"),
            Some(ToolCallFormat::Llama3)
        );
    }

    #[cfg(feature = "structured")]
    #[test]
    fn qwen_xml_grammar_keeps_string_values_to_their_schema_or_refuses() {
        let tool = |props: Value| Tool {
            name: "f".into(),
            description: None,
            parameters: json!({"type": "object", "properties": props, "required": ["a"]}),
        };
        let g = qwen_xml_grammar(
            &[tool(json!({"a": {"type": "string", "maxLength": 5},
                          "b": {"enum": ["x", "y"]}, "c": {"type": "integer"}}))],
            |v| v,
        )
        .unwrap();
        assert!(
            g.contains(r#"p0_0: "<parameter=a>\n" /[\x20-\x3B\x3D-\x7E]{0,5}/"#),
            "{g}"
        );
        assert!(g.contains(r#"("x" | "y")"#), "{g}");
        assert!(g.contains(r#"%json {"type":"integer"}"#), "{g}");
        // Required written, optional may be.
        assert!(g.contains("p0_0 p0_1? p0_2?"), "{g}");
        for (props, why) in [
            (
                json!({"a": {"type": "string", "pattern": "^x$"}}),
                "pattern",
            ),
            (
                json!({"a": {"anyOf": [{"type": "string"}]}}),
                "without one type",
            ),
            (
                json!({"a b": {"type": "integer"}, "a": {"type": "integer"}}),
                "cannot be written",
            ),
            (json!({"z": {"type": "integer"}}), "has no schema"),
        ] {
            let e = qwen_xml_grammar(&[tool(props)], |v| v).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn parses_each_syntax() {
        let (c, calls) = ToolCallFormat::Hermes.parse(
            "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>",
            &[],
        );
        assert_eq!(c.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "weather");
        assert_eq!(calls[0].arguments, json!({"city": "Oslo"}));
        assert_eq!(calls[1].arguments, json!({}));

        let (c, calls) = ToolCallFormat::QwenXml.parse(
            "<tool_call>\n<function=weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            &[],
        );
        assert_eq!(c, None);
        assert_eq!(calls[0].arguments, json!({"city": "Oslo", "days": 3}));
        // Read by the declared types: a string parameter's value is its text.
        let tools = [Tool {
            name: "weather".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "string"},
                "unit": {"enum": ["true", "c"]}, "n": {"type": "integer"}}}),
        }];
        let (_, calls) = ToolCallFormat::QwenXml.parse(
            "<tool_call>\n<function=weather>\n<parameter=days>\n3\n</parameter>\n<parameter=unit>\ntrue\n</parameter>\n<parameter=n>\n4\n</parameter>\n<parameter=x>\n[1]\n</parameter>\n</function>\n</tool_call>",
            &tools,
        );
        assert_eq!(
            calls[0].arguments,
            json!({"days": "3", "unit": "true", "n": 4, "x": [1]})
        );

        let (_, calls) = ToolCallFormat::Llama3.parse(
            "<|python_tag|>{\"name\": \"weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            &[],
        );
        assert_eq!(calls[0].name, "weather");

        let (_, calls) = ToolCallFormat::Mistral.parse(
            "[TOOL_CALLS][{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
            &[],
        );
        assert_eq!(calls[0].arguments, json!({"city": "Oslo"}));
        let (_, calls) =
            ToolCallFormat::Mistral.parse("[TOOL_CALLS]weather[ARGS]{\"city\": \"Oslo\"}", &[]);
        assert_eq!(calls[0].name, "weather");

        // Not a call: all content.
        let (c, calls) = ToolCallFormat::Hermes.parse("<tool_call>\n{not json\n</tool_call>", &[]);
        assert!(calls.is_empty());
        assert_eq!(c.as_deref(), Some("<tool_call>\n{not json\n</tool_call>"));
        let (c, calls) = ToolCallFormat::Hermes.parse("Just text.", &[]);
        assert!(calls.is_empty());
        assert_eq!(c.as_deref(), Some("Just text."));
    }
}
