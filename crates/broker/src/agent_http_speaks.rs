//! What a new connection to an agent's socket speaks (issue 41): MCP
//! streamable HTTP or JSON-RPC lines, told apart by its first byte.

use tokio::io::Interest;

/// What a new connection to an agent's socket speaks, from its first byte
/// (read without taking it: the server that answers reads it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    /// JSON-RPC lines (the stdio relay, a direct client): the line gate.
    Lines,
    /// HTTP/1.1 (MCP streamable HTTP through the sandbox's bridge).
    Http,
}

impl Speaks {
    /// An HTTP request line starts with its method, ASCII capitals; a
    /// JSON-RPC line with `{` (or blank space). A client that closes
    /// before a byte is the line gate's to end.
    pub fn of_first_byte(first: Option<u8>) -> Self {
        match first {
            Some(b'A'..=b'Z') => Self::Http,
            _ => Self::Lines,
        }
    }

    /// Waits for the first byte of `stream` and peeks at it.
    pub async fn of(stream: &tokio::net::UnixStream) -> std::io::Result<Self> {
        let mut first = [0u8; 1];
        loop {
            stream.readable().await?;
            let peeked = stream.try_io(Interest::READABLE, || {
                rustix::net::recv(stream, &mut first[..], rustix::net::RecvFlags::PEEK)
                    .map_err(std::io::Error::from)
            });
            match peeked {
                Ok((0, _)) => return Ok(Self::of_first_byte(None)),
                Ok(_) => return Ok(Self::of_first_byte(Some(first[0]))),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Speaks;

    #[test]
    fn an_http_method_is_told_from_a_json_line_by_its_first_byte() {
        for first in [b'P', b'G', b'D', b'O', b'H'] {
            assert_eq!(Speaks::of_first_byte(Some(first)), Speaks::Http);
        }
        for first in [b'{', b' ', b'\n', b'[', b'p', 0, 0xff] {
            assert_eq!(Speaks::of_first_byte(Some(first)), Speaks::Lines);
        }
        assert_eq!(Speaks::of_first_byte(None), Speaks::Lines);
    }
}
