use super::*;

fn tap(api: Api, framing: Framing, chunks: &[&[u8]]) -> Reading {
    let mut tap = UsageTap::new(api, framing);
    for chunk in chunks {
        tap.feed(chunk);
    }
    tap.finish()
}

fn whole(input: u64, output: u64, model: Option<&str>) -> Reading {
    Reading::Whole(Usage {
        input_tokens: input,
        output_tokens: output,
        model: model.map(str::to_string),
    })
}

const ANTHROPIC_SSE: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":3,\"output_tokens\":1}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n",
    "event: message_delta\r\n",
    "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\r\n\r\n",
);

#[test]
fn anthropic_stream_split_anywhere() {
    let body = ANTHROPIC_SSE.as_bytes();
    for cut in 0..body.len() {
        let (a, b) = body.split_at(cut);
        assert_eq!(
            tap(Api::Anthropic, Framing::EventStream, &[a, b]),
            whole(15, 7, Some("claude-x")),
            "{cut}"
        );
    }
}

#[test]
fn an_answer_cut_before_its_final_usage_is_partial() {
    let body = ANTHROPIC_SSE.as_bytes();
    let before_delta = ANTHROPIC_SSE.find("event: message_delta").unwrap();
    assert!(matches!(
        tap(
            Api::Anthropic,
            Framing::EventStream,
            &[&body[..before_delta]]
        ),
        Reading::Partial(Usage {
            input_tokens: 15,
            output_tokens: 1,
            ..
        })
    ));
    // An error after the answer began: what it generated is not known.
    let errored = format!(
        "{}data: {{\"type\":\"error\",\"error\":{{\"type\":\"overloaded_error\"}}}}\n",
        &ANTHROPIC_SSE[..before_delta]
    );
    assert!(matches!(
        tap(Api::Anthropic, Framing::EventStream, &[errored.as_bytes()]),
        Reading::Partial(_)
    ));
    // An error before anything: nothing was used.
    let refused =
        b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    assert_eq!(
        tap(Api::Anthropic, Framing::EventStream, &[refused]),
        whole(0, 0, None)
    );
    let plain_error = br#"{"type":"error","error":{"type":"invalid_request_error"}}"#;
    assert_eq!(
        tap(Api::Anthropic, Framing::Json, &[plain_error]),
        whole(0, 0, None)
    );
}

#[test]
fn openai_and_gemini_streams_and_plain_bodies() {
    let openai = b"data: {\"type\":\"response.created\"}\n\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2}}}\n\n";
    assert_eq!(
        tap(Api::OpenAi, Framing::EventStream, &[openai]),
        whole(5, 2, Some("m"))
    );
    let failed = b"data: {\"type\":\"response.created\"}\n\ndata: {\"type\":\"response.failed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":9}}}\n\n";
    assert_eq!(
        tap(Api::OpenAi, Framing::EventStream, &[failed]),
        whole(5, 9, None)
    );
    let gemini = b"data: {\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":1}}\n\ndata: {\"modelVersion\":\"g\",\"candidates\":[{\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":9,\"thoughtsTokenCount\":2}}";
    assert_eq!(
        tap(Api::Gemini, Framing::EventStream, &[gemini]),
        whole(4, 11, Some("g"))
    );
    let with_total = br#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":9,"totalTokenCount":30}}"#;
    assert_eq!(
        tap(Api::Gemini, Framing::Json, &[with_total]),
        whole(4, 26, None)
    );
    let plain = br#"{"type":"message","model":"c","usage":{"input_tokens":3,"output_tokens":4}}"#;
    assert_eq!(
        tap(Api::Anthropic, Framing::Json, &[&plain[..10], &plain[10..]]),
        whole(3, 4, Some("c"))
    );
}

#[test]
fn a_gemini_stream_as_a_json_array_is_read_element_by_element() {
    let array = br#"[{"candidates":[{"content":{}}],"usageMetadata":{"promptTokenCount":4}},
        {"candidates":[{"finishReason":"MAX_TOKENS"}],"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":50}}]"#;
    assert_eq!(
        tap(Api::Gemini, Framing::Json, &[array]),
        whole(4, 50, None)
    );
    // Counts seen only before the finish are not the total.
    let early = br#"[{"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":1}},
        {"candidates":[{"finishReason":"STOP"}]}]"#;
    assert!(matches!(
        tap(Api::Gemini, Framing::Json, &[early]),
        Reading::Partial(_)
    ));
}

#[test]
fn whatever_cannot_be_read_is_partial_never_zero() {
    let gzip = [0x1f, 0x8b, 8, 0, 0, 0];
    for framing in [Framing::Json, Framing::EventStream, Framing::Encoded] {
        for api in Api::ALL {
            assert!(
                matches!(tap(api, framing, &[&gzip]), Reading::Partial(_)),
                "{api:?} {framing:?}"
            );
        }
    }
    // A completed answer whose counts are missing or not numbers.
    for body in [
        &br#"{"type":"message","usage":{"input_tokens":3}}"#[..],
        br#"{"type":"message","usage":{"input_tokens":"3","output_tokens":4}}"#,
        br#"{"object":"response","usage":null}"#,
        br#"[1,2]"#,
        br#"{}"#,
    ] {
        for api in Api::ALL {
            assert!(
                matches!(tap(api, Framing::Json, &[body]), Reading::Partial(_)),
                "{api:?} {}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

#[test]
fn an_overlong_line_makes_the_reading_partial() {
    let long = vec![b'x'; MAX_HELD + 10];
    let end = b"\ndata: {\"candidates\":[{\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":1,\"candidatesTokenCount\":1}}\n";
    let reading = tap(Api::Gemini, Framing::EventStream, &[b"data: ", &long, end]);
    assert!(
        matches!(&reading, Reading::Partial(u) if u.total() == 2),
        "{reading:?}"
    );
    let big = vec![b' '; MAX_HELD + 1];
    assert!(matches!(
        tap(Api::OpenAi, Framing::Json, &[&big, b"{}"]),
        Reading::Partial(_)
    ));
}
