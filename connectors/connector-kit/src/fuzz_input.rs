//! How every engine's fuzz targets (`fuzz/`, each engine's `src/fuzzing.rs`) cut their
//! input into the messages of a replication stream, so that one seed format serves them
//! all.

/// Splits fuzz input into messages: each a 2-byte big-endian length and that many bytes
/// (the last one cut short if the input ends early, a lone trailing byte dropped).
#[must_use]
pub fn split_messages(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([data[0], data[1]]));
        let rest = &data[2..];
        let (message, tail) = rest.split_at(len.min(rest.len()));
        out.push(message);
        data = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_length_prefixed_and_the_last_may_be_cut_short() {
        assert_eq!(
            split_messages(&[0, 2, b'a', b'b', 0, 0, 0, 5, b'c', 9]),
            vec![&b"ab"[..], &b""[..], &[b'c', 9][..]]
        );
        assert!(split_messages(&[7]).is_empty());
    }
}
