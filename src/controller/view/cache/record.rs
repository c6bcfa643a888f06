//! One allocation per cached object: the short strings that find it (namespace, names,
//! uids), each behind a two-byte length, then the JSON of what the operator reads of it.
//! A `String` per field and a key struct per map entry cost 16–48 bytes of allocator
//! overhead each, and a map of wide entries leaves most of its slack empty (measured by
//! `benches/examples/footprint.rs`).

/// `fields` (each at most 64 KiB: Kubernetes names and uids are far shorter), then
/// `tail`. `None` for a field too long.
pub(super) fn pack<const N: usize>(fields: [&str; N], tail: &[u8]) -> Option<Box<[u8]>> {
    let len = fields.iter().map(|f| 2 + f.len()).sum::<usize>() + tail.len();
    let mut out = Vec::with_capacity(len);
    for field in fields {
        let n = u16::try_from(field.len()).ok()?;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    out.extend_from_slice(tail);
    Some(out.into_boxed_slice())
}

/// The fields and tail of a record [`pack`] made; `None` for anything else.
pub(super) fn unpack<const N: usize>(record: &[u8]) -> Option<([&str; N], &[u8])> {
    let mut fields = [""; N];
    let mut rest = record;
    for field in &mut fields {
        let (len, after) = rest.split_first_chunk::<2>()?;
        let n = usize::from(u16::from_le_bytes(*len));
        if after.len() < n {
            return None;
        }
        let (bytes, after) = after.split_at(n);
        *field = std::str::from_utf8(bytes).ok()?;
        rest = after;
    }
    Some((fields, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_tail_read_back() {
        let packed = pack(["ns", "", "gj-1"], b"{\"a\":1}").expect("short fields");
        let (fields, tail) = unpack::<3>(&packed).expect("a record");
        assert_eq!(fields, ["ns", "", "gj-1"]);
        assert_eq!(tail, b"{\"a\":1}");
        assert_eq!(unpack::<4>(&packed[..3]), None, "cut short");
        let long = "x".repeat(70_000);
        assert_eq!(pack([long.as_str()], b""), None, "a field over 64 KiB");
    }
}
