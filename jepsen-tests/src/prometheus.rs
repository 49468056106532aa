//! The cluster's Prometheus (`make up` starts one) through its HTTP API: what the drills
//! read their alerts from and the tests check the rules and dashboard against.

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::Value;

/// `GET path` (with its query) of the Prometheus at `url` (`http://host:port`): the
/// answer's `data`. HTTP/1.0, so the body comes whole, never chunked.
pub fn api(url: &str, path: &str) -> anyhow::Result<Value> {
    let addr = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr)
        .with_context(|| format!("connecting to Prometheus at {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let answer: Value = serde_json::from_str(body)
        .with_context(|| format!("Prometheus answered {path} with {response}"))?;
    ensure!(answer["status"] == "success", "{path}: {answer}");
    Ok(answer["data"].clone())
}

/// An instant PromQL query: its series.
pub fn query(url: &str, promql: &str) -> anyhow::Result<Vec<Value>> {
    let data = api(url, &format!("/api/v1/query?query={}", encode(promql)))?;
    Ok(data["result"].as_array().cloned().unwrap_or_default())
}

/// Percent-encodes everything but unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn promql_is_percent_encoded() {
        assert_eq!(
            super::encode("a{b=\"c\"}[5s]"),
            "a%7Bb%3D%22c%22%7D%5B5s%5D"
        );
    }
}
