//! What a request asks its output to look like, checked: `response_format` (structured
//! outputs), `tools` and `tool_choice`, and the fields the server refuses because it does not
//! honour them ([`Unsupported`]).

use serde::Deserialize;

use super::api::{ApiError, ChatRequest, Generation};

/// Request fields of OpenAI's API or llama-server's that would change the output and that this
/// server does not honour: each is refused with a 400 naming it when set to anything but its
/// neutral value (an empty list, 0, `false`, ...), never silently ignored.
#[derive(Debug, Default, Deserialize)]
pub struct Unsupported {
    logit_bias: Option<serde_json::Value>,
    presence_penalty: Option<serde_json::Value>,
    frequency_penalty: Option<serde_json::Value>,
    repeat_penalty: Option<serde_json::Value>,
    min_p: Option<serde_json::Value>,
    typical_p: Option<serde_json::Value>,
    mirostat: Option<serde_json::Value>,
    best_of: Option<serde_json::Value>,
    echo: Option<serde_json::Value>,
    suffix: Option<serde_json::Value>,
    grammar: Option<serde_json::Value>,
    prediction: Option<serde_json::Value>,
    audio: Option<serde_json::Value>,
    modalities: Option<serde_json::Value>,
    functions: Option<serde_json::Value>,
    function_call: Option<serde_json::Value>,
    tools: Option<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
}

impl Unsupported {
    /// The first field set to a value that would change the output.
    ///
    /// # Errors
    /// A 400 naming the field and saying what the server does instead.
    pub fn check(&self) -> Result<(), ApiError> {
        use serde_json::Value;
        fn neutral(v: &Value, zero: f64) -> bool {
            match v {
                Value::Null => true,
                Value::Bool(b) => !b,
                Value::Number(n) => n.as_f64() == Some(zero),
                Value::String(s) => s.is_empty() || s == "none",
                Value::Array(a) => a.is_empty() || *a == [Value::from("text")],
                Value::Object(o) => o.is_empty(),
            }
        }
        let fields: [(&'static str, &Option<Value>, f64, &str); 18] = [
            (
                "logit_bias",
                &self.logit_bias,
                0.0,
                "token biases are not supported",
            ),
            (
                "presence_penalty",
                &self.presence_penalty,
                0.0,
                "penalties are not supported",
            ),
            (
                "frequency_penalty",
                &self.frequency_penalty,
                0.0,
                "penalties are not supported",
            ),
            (
                "repeat_penalty",
                &self.repeat_penalty,
                1.0,
                "penalties are not supported",
            ),
            (
                "min_p",
                &self.min_p,
                0.0,
                "min-p sampling is not supported (top_k, top_p are)",
            ),
            (
                "typical_p",
                &self.typical_p,
                1.0,
                "typical sampling is not supported",
            ),
            ("mirostat", &self.mirostat, 0.0, "mirostat is not supported"),
            (
                "best_of",
                &self.best_of,
                1.0,
                "only best_of = 1 is supported",
            ),
            ("echo", &self.echo, 0.0, "echo is not supported"),
            (
                "suffix",
                &self.suffix,
                0.0,
                "suffix (fill-in-the-middle) is not supported",
            ),
            (
                "grammar",
                &self.grammar,
                0.0,
                "GBNF grammars are not supported; use response_format with a JSON schema",
            ),
            (
                "prediction",
                &self.prediction,
                0.0,
                "predicted outputs are not supported",
            ),
            ("audio", &self.audio, 0.0, "audio output is not supported"),
            (
                "modalities",
                &self.modalities,
                0.0,
                "only the text modality is supported",
            ),
            (
                "functions",
                &self.functions,
                0.0,
                "the legacy functions field is not supported; use tools",
            ),
            (
                "function_call",
                &self.function_call,
                0.0,
                "the legacy function_call field is not supported; use tool_choice",
            ),
            (
                "tools",
                &self.tools,
                0.0,
                "tools are for /v1/chat/completions",
            ),
            (
                "tool_choice",
                &self.tool_choice,
                0.0,
                "tools are for /v1/chat/completions",
            ),
        ];
        for (name, value, zero, why) in fields {
            if let Some(v) = value
                && !neutral(v, zero)
            {
                return Err(ApiError::bad_request(format!("{name}: {why}"), Some(name)));
            }
        }
        Ok(())
    }
}

/// The grammar a request's `response_format` (or llama-server's `json_schema`) asks for:
/// `None` for text.
///
/// # Errors
/// A 400 naming `response_format` (or `json_schema`) for an unknown type, a missing or
/// non-object schema, or both fields at once.
pub fn check_response_format(
    g: &Generation,
) -> Result<Option<burn_gguf_models::structured::Grammar>, ApiError> {
    use burn_gguf_models::structured::Grammar;
    use serde_json::Value;
    let bad = |m: String| ApiError::bad_request(m, Some("response_format"));
    let schema_object = |v: &Value, field: &'static str| match v {
        Value::Object(_) => Ok(v.clone()),
        other => Err(ApiError::bad_request(
            format!("{field} must be a JSON schema object, got {other}"),
            Some(field),
        )),
    };
    let from_format = match &g.response_format {
        None | Some(Value::Null) => None,
        Some(Value::Object(f)) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Grammar::JsonObject),
            Some("json_schema") => {
                let Some(js) = f.get("json_schema").and_then(Value::as_object) else {
                    return Err(bad(
                        "response_format.json_schema must be an object with a `schema`".into(),
                    ));
                };
                if let Some(name) = js.get("name")
                    && !name.as_str().is_some_and(valid_name)
                {
                    return Err(bad(format!(
                        "response_format.json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, _                          and -, got {name}"
                    )));
                }
                if js
                    .get("strict")
                    .is_some_and(|s| !s.is_boolean() && !s.is_null())
                {
                    return Err(bad(
                        "response_format.json_schema.strict must be a boolean".into()
                    ));
                }
                match js.get("schema") {
                    Some(schema) => Some(Grammar::JsonSchema(schema_object(
                        schema,
                        "response_format",
                    )?)),
                    // OpenAI: no schema is any JSON object.
                    None => Some(Grammar::JsonObject),
                }
            }
            Some(other) => {
                return Err(bad(format!(
                    "response_format.type '{other}' is not supported (text, json_object,                      json_schema)"
                )));
            }
            None => return Err(bad("response_format needs a string `type`".into())),
        },
        Some(other) => {
            return Err(bad(format!(
                "response_format must be an object, got {other}"
            )));
        }
    };
    let shorthand = match &g.json_schema {
        None | Some(Value::Null) => None,
        Some(v) => Some(Grammar::JsonSchema(schema_object(v, "json_schema")?)),
    };
    match (from_format, shorthand) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give either response_format or json_schema, not both",
            Some("json_schema"),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// `tool_choice`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model does not call tools (they are still in the prompt).
    None,
    /// The model chooses: text or calls.
    Auto,
    /// The reply is one call of one of the tools.
    Required,
    /// The reply is one call of this function.
    Named(String),
}

/// A request's tools, checked.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// The declared functions.
    pub tools: Vec<burn_gguf_models::tool_calls::Tool>,
    /// What the model may do with them.
    pub choice: ToolChoice,
    /// Whether a reply may hold several calls.
    pub parallel: bool,
}

/// The tools of a chat request: `None` when it declares none.
///
/// # Errors
/// A 400 naming `tools` (not a list, past [`burn_gguf_models::tool_calls::MAX_TOOLS`], an
/// entry that is not a function, a bad or repeated name, parameters that are not an object
/// schema) or `tool_choice` (an unknown value, a function not among the tools, a choice with
/// no tools).
pub fn check_tools(req: &ChatRequest) -> Result<Option<ToolRequest>, ApiError> {
    use burn_gguf_models::tool_calls::{MAX_TOOLS, Tool};
    use serde_json::Value;
    let bad = |m: String| ApiError::bad_request(m, Some("tools"));
    let list = match &req.tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if a.len() > MAX_TOOLS => {
            return Err(bad(format!("at most {MAX_TOOLS} tools")));
        }
        Some(Value::Array(a)) => a.clone(),
        Some(other) => return Err(bad(format!("tools must be a list, got {other}"))),
    };
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("tools[{i}].type must be \"function\"")));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(bad(format!("tools[{i}].function must be an object")));
        };
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        if !valid_name(name) {
            return Err(bad(format!(
                "tools[{i}].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -"
            )));
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(bad(format!(
                "tools[{i}]: function '{name}' is declared twice"
            )));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(other) => {
                return Err(bad(format!(
                    "tools[{i}].function.parameters must be a JSON schema object, got {other}"
                )));
            }
        };
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => return Err(bad(format!("tools[{i}].function.description must be text"))),
        };
        tools.push(Tool {
            name: name.to_string(),
            description,
            parameters,
        });
    }
    let bad_choice = |m: String| ApiError::bad_request(m, Some("tool_choice"));
    let choice = match &req.tool_choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad_choice(format!(
                    "tool_choice '{other}' is not one of none, auto, required"
                )));
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => {
                    if !tools.iter().any(|t| t.name == n) {
                        return Err(bad_choice(format!(
                            "tool_choice names '{n}', which is not among the tools"
                        )));
                    }
                    ToolChoice::Named(n.to_string())
                }
                _ => {
                    return Err(bad_choice(
                        "tool_choice must be none, auto, required or {\"type\": \"function\", \
                         \"function\": {\"name\": ...}}"
                            .into(),
                    ));
                }
            }
        }
        Some(other) => return Err(bad_choice(format!("tool_choice: unexpected {other}"))),
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Required | ToolChoice::Named(_) if req.tool_choice.is_some() => {
                Err(bad_choice("tool_choice needs tools".into()))
            }
            _ => Ok(None),
        };
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
    }))
}

/// An OpenAI function or schema name: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}
