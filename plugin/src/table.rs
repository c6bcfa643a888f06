//! Plain text tables, as kubectl prints them: a header, columns two spaces apart.

pub fn render<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = [
            ["1".to_owned(), "train-1".to_owned()],
            ["10".to_owned(), "t".to_owned()],
        ];
        assert_eq!(
            render(&["A", "JOB"], &rows),
            "A   JOB\n1   train-1\n10  t\n"
        );
    }
}
