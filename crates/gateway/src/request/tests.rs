use super::*;

fn facts(api: Api, body: &str) -> RequestFacts {
    skim(api, body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"))
}

fn hosted(list: &[HostedTool]) -> BTreeSet<HostedTool> {
    list.iter().copied().collect()
}

#[test]
fn anthropic_requests_are_read_whatever_their_spelling() {
    let plain = facts(
        Api::Anthropic,
        r#"{"model":"claude-x","max_tokens":1024,"stream":true,
            "tools":[{"name":"mcp__substrat__send_message","input_schema":{"type":"object"}},
                     {"type":"bash_20250124","name":"bash"}],
            "messages":[{"role":"user","content":"hi \" \\ \u00e9"}]}"#,
    );
    assert_eq!(
        plain,
        RequestFacts {
            model: Some("claude-x".into()),
            models: ["claude-x".to_string()].into(),
            max_output_tokens: Some(1024),
            ..RequestFacts::default()
        }
    );
    // Escaped keys, keys given twice, a server tool among client ones.
    let sly = facts(
        Api::Anthropic,
        r#"{"max_tokens":10,"max\u005ftokens":90000,"tools":[
            {"name":"x","ty\u0070e":"custom","type":"web_search_20250305"},
            {"type":"web_fetch_20250910"}],"mcp_servers":[{"url":"https://x"}]}"#,
    );
    assert_eq!(sly.max_output_tokens, Some(90000));
    assert_eq!(
        sly.hosted,
        hosted(&[
            HostedTool::WebSearch,
            HostedTool::WebFetch,
            HostedTool::RemoteMcp
        ])
    );
    let empty_servers = facts(Api::Anthropic, r#"{"mcp_servers":[],"tools":[]}"#);
    assert!(empty_servers.hosted.is_empty());
    let odd = facts(
        Api::Anthropic,
        r#"{"max_tokens":1e3,"tools":[{"type":"tool_search_tool_regex_20251119"}]}"#,
    );
    assert_eq!(odd.max_output_tokens, Some(1000));
    assert_eq!(
        odd.unknown_tools,
        ["tool_search_tool_regex_20251119".to_string()].into()
    );
    for count in ["-1", "1.5", "99999999999999999999999", "1e400", "\"lots\""] {
        let body = format!(r#"{{"max_tokens":{count}}}"#);
        let read = facts(Api::Anthropic, &body);
        assert!(read.unreadable_count, "{count}");
        assert_eq!(read.max_output_tokens, None, "{count}");
    }
}

#[test]
fn openai_tools_inside_namespaces_are_read() {
    let body = r#"{"model":"gpt-x","max_output_tokens":500,"tools":[
        {"type":"function","name":"shell","parameters":{"type":"object"}},
        {"type":"namespace","name":"mcp__substrat","tools":[{"type":"function","name":"a"},
            {"type":"code_interpreter"}]},
        {"type":"web_search_preview_2025_03_11"},{"type":"mcp","server_url":"https://x"},
        {"type":"brand_new_kind"}]}"#;
    let read = facts(Api::OpenAi, body);
    assert_eq!(read.max_output_tokens, Some(500));
    assert_eq!(
        read.hosted,
        hosted(&[
            HostedTool::WebSearch,
            HostedTool::CodeExecution,
            HostedTool::RemoteMcp
        ])
    );
    assert_eq!(read.unknown_tools, ["brand_new_kind".to_string()].into());
    // Tools offered in an input item (Codex's code mode) are read too.
    let item = r#"{"input":[{"type":"message","content":"hi"},
        {"type":"additional_tools","tools":[{"type":"function","name":"exec"},{"type":"web_search"}]}]}"#;
    assert_eq!(
        facts(Api::OpenAi, item).hosted,
        hosted(&[HostedTool::WebSearch])
    );
    // Anthropic's names mean nothing here, and the reverse.
    assert_eq!(
        facts(Api::OpenAi, r#"{"max_tokens":5}"#).max_output_tokens,
        None
    );
}

#[test]
fn gemini_tools_are_their_keys_in_either_spelling() {
    let body = r#"{"contents":[],"generation_config":{"maxOutputTokens":"2048"},
        "generationConfig":{"max_output_tokens":100},
        "tools":[{"functionDeclarations":[{"name":"f","parameters":{"type":"OBJECT"}}]},
                 {"google_search":{}},{"URL_CONTEXT":{}},{"codeExecution":{}},{"shinyNew":{}}]}"#;
    let read = facts(Api::Gemini, body);
    assert_eq!(read.max_output_tokens, Some(2048));
    assert_eq!(
        read.hosted,
        hosted(&[
            HostedTool::WebSearch,
            HostedTool::WebFetch,
            HostedTool::CodeExecution
        ])
    );
    assert_eq!(read.unknown_tools, ["shinyNew".to_string()].into());
    let long_key = format!(r#"{{"tools":[{{"{}":{{}}}}]}}"#, "k".repeat(400));
    assert_eq!(facts(Api::Gemini, &long_key).unknown_tools.len(), 1);
}

#[test]
fn a_long_or_broken_tool_type_is_unknown_never_a_client_tool() {
    let long = format!(r#"{{"tools":[{{"type":"{}é"}}]}}"#, "w".repeat(255));
    assert_eq!(facts(Api::Anthropic, &long).unknown_tools.len(), 1);
    let number = r#"{"tools":[{"type":7}]}"#;
    assert_eq!(facts(Api::OpenAi, number).unknown_tools.len(), 1);
}

#[test]
fn only_strict_json_objects_are_read() {
    for bad in [
        "",
        "[]",
        "{\"a\":1,}",
        "{\"a\":NaN}",
        "{/*c*/}",
        "{\"a\":1} x",
        "{\"a\":\"unterminated",
        "{\"a\":\"\u{1}\"}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":\"\\x\"}",
        "{\"a\":tru}",
        "{'a':1}",
    ] {
        assert!(
            matches!(
                skim(Api::Anthropic, bad.as_bytes()),
                Err(SkimError::Syntax(_))
            ),
            "{bad:?}"
        );
    }
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
    assert!(matches!(
        skim(Api::Anthropic, deep.as_bytes()),
        Err(SkimError::TooDeep)
    ));
    assert!(skim(Api::Anthropic, "{\"a\":[[[1]]]} \r\n".as_bytes()).is_ok());
}

#[test]
fn a_large_body_is_read_through_a_small_buffer() {
    let text = "x".repeat(3 << 20);
    let body = format!(r#"{{"messages":[{{"content":"{text}"}}],"max_tokens":7}}"#);
    let reader = std::io::BufReader::with_capacity(64, body.as_bytes());
    assert_eq!(
        skim(Api::Anthropic, reader).unwrap().max_output_tokens,
        Some(7)
    );
}

/// Content the provider fetches or keeps, and switches that hide what an
/// answer used: wherever they are in the body, whatever the API.
#[test]
fn urls_stored_state_and_background_runs_are_seen() {
    let cases: [(Api, &str, &[HostedTool], &[&str]); 12] = [
        (
            Api::Anthropic,
            r#"{"messages":[{"role":"user","content":[{"type":"document",
            "source":{"type":"url","url":"https://x/a.pdf?d=SECRET"}}]}]}"#,
            &[HostedTool::WebFetch],
            &[],
        ),
        (
            Api::Anthropic,
            r#"{"messages":[{"content":[{"type":"image","source":{"url":"https://x"}}]}]}"#,
            &[HostedTool::WebFetch],
            &[],
        ),
        (
            Api::Anthropic,
            r#"{"messages":[{"content":[{"type":"document","source":{"type":"file","file_id":"f"}}]}]}"#,
            &[],
            &["a file source", "file_id"],
        ),
        (
            Api::OpenAi,
            r#"{"input":[{"role":"user","content":[{"type":"input_file","file_url":"https://x"}]}]}"#,
            &[HostedTool::WebFetch],
            &[],
        ),
        (
            Api::OpenAi,
            r#"{"input":[{"content":[{"type":"input_image","image_url":"https://x/i.png"}]}]}"#,
            &[HostedTool::WebFetch],
            &[],
        ),
        (
            Api::OpenAi,
            r#"{"background":true,"previous_response_id":"r","conversation":{"id":"c"},"prompt":{"id":"p"}}"#,
            &[],
            &[
                "background",
                "conversation",
                "previous_response_id",
                "prompt",
            ],
        ),
        (
            Api::OpenAi,
            r#"{"input":[{"type":"item_reference","id":"i"}]}"#,
            &[],
            &["item_reference"],
        ),
        (
            Api::OpenAi,
            r#"{"tools":[{"type":"shell","environment":{"type":"container_auto"}}]}"#,
            &[HostedTool::CodeExecution],
            &[],
        ),
        (
            Api::Gemini,
            r#"{"contents":[{"parts":[{"fileData":{"fileUri":"https://youtu.be/x"}}]}]}"#,
            &[HostedTool::WebFetch],
            &[],
        ),
        (
            Api::Gemini,
            r#"{"cachedContent":"cachedContents/x"}"#,
            &[],
            &["cachedContent"],
        ),
        (
            Api::Gemini,
            r#"{"generationConfig":{"candidateCount":8}}"#,
            &[],
            &["candidateCount"],
        ),
        // What is harmless: inline images, null and false switches, one candidate.
        (
            Api::OpenAi,
            r#"{"background":false,"previous_response_id":null,"input":[{"content":[
            {"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}]}"#,
            &[],
            &[],
        ),
    ];
    for (api, body, want_hosted, want_unbounded) in cases {
        let read = facts(api, body);
        assert_eq!(read.hosted, hosted(want_hosted), "{body}");
        let unbounded: Vec<&str> = read.unbounded.iter().copied().collect();
        assert_eq!(unbounded, want_unbounded, "{body}");
    }
    let one = facts(Api::Gemini, r#"{"generationConfig":{"candidateCount":1}}"#);
    assert!(one.unbounded.is_empty());
}

#[test]
fn every_model_a_body_names_is_read_however_it_is_smuggled() {
    let models = |api, body: &str| {
        let read = facts(api, body);
        (
            read.models.into_iter().collect::<Vec<_>>(),
            read.unreadable_model,
        )
    };
    // A duplicate key (a parser keeping the last), an escaped key, another case.
    assert_eq!(
        models(Api::Anthropic, r#"{"model":"ok","model":"big"}"#),
        (vec!["big".into(), "ok".into()], false)
    );
    assert_eq!(
        models(Api::Anthropic, r#"{"model":"ok","mod\u0065l":"big"}"#),
        (vec!["big".into(), "ok".into()], false)
    );
    assert_eq!(
        models(Api::OpenAi, r#"{"model":"ok","Model":"big","MODEL":"x"}"#),
        (vec!["big".into(), "ok".into(), "x".into()], false)
    );
    // Where an API reads a model below the root: an OpenAI tool's, also
    // inside a namespace.
    assert_eq!(
        models(
            Api::OpenAi,
            r#"{"model":"ok","tools":[{"type":"namespace","tools":[{"type":"function","model":"big"}]}]}"#
        ),
        (vec!["big".into(), "ok".into()], false)
    );
    // Gemini's body model (the path's is read by the route).
    assert_eq!(
        models(Api::Gemini, r#"{"contents":[],"model":"models/big"}"#),
        (vec!["models/big".into()], false)
    );
    // Not a name read whole: refused when models are limited.
    for body in [
        r#"{"model":["a","b"]}"#,
        r#"{"model":{"name":"big"}}"#,
        r#"{"model":7}"#,
        r#"{"model":null}"#,
    ] {
        assert!(facts(Api::Anthropic, body).unreadable_model, "{body}");
    }
    let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(300));
    assert!(facts(Api::Anthropic, &long).unreadable_model);
    let many: Vec<String> = (0..=MAX_MODELS)
        .map(|i| format!(r#""model":"m{i}""#))
        .collect();
    let many = format!("{{{}}}", many.join(","));
    assert!(facts(Api::Anthropic, &many).unreadable_model);
    // A key named model elsewhere is content (a tool's schema, a call's
    // input in the history), not the request's model.
    let content = r#"{"model":"ok","tools":[{"name":"spawn_agent","input_schema":{"properties":{"model":{"type":"string"}}}}],
        "messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"spawn_agent","input":{"model":"big"}}]}]}"#;
    assert_eq!(models(Api::Anthropic, content), (vec!["ok".into()], false));
}

#[test]
fn a_key_read_as_model_up_to_a_nul_or_invisible_characters_is_a_model_key() {
    for key in [
        "model",
        "MODEL",
        "model\0",
        "model\0xyz",
        "mod\u{200b}el",
        "\u{feff}model",
        "model\n",
        " model ",
    ] {
        assert!(super::is_model_key(key), "{key:?}");
    }
    for key in ["models", "modelx", "mode", "\0model", "xmodel"] {
        assert!(!super::is_model_key(key), "{key:?}");
    }
    let read = facts(
        Api::Anthropic,
        r#"{"model\u0000":"claude-opus-5","model":"claude-sonnet-5"}"#,
    );
    assert!(read.models.contains("claude-opus-5"), "{:?}", read.models);
}
