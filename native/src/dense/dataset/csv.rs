//! A small CSV reader: comma-separated, RFC 4180 quoting (`"a,b"`, `""` for a quote, line
//! breaks inside quotes), LF or CRLF line ends, blank lines skipped. Every error names the
//! file and the line where the record starts.

use std::path::Path;

use crate::{NetworkError, Result};

/// One record: its fields and the (1-based) line it starts on.
pub struct Record {
    pub line: usize,
    pub fields: Vec<String>,
}

pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    let bytes = crate::io::files::read(path)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()].iter().filter(|&&b| b == b'\n').count();
        NetworkError::parse(path, format!("line {line}"), "the file is not valid UTF-8 text")
    })?;
    parse(&text).map_err(|(line, message)| NetworkError::parse(path, format!("line {line}"), message))
}

fn parse(text: &str) -> std::result::Result<Vec<Record>, (usize, String)> {
    let mut records = Vec::new();
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut line = 1;
    let mut start_line = 1;
    let mut in_quotes = false;
    let mut quoted_field = false;
    let mut chars = text.chars().peekable();
    let mut record_has_content = false;
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => in_quotes = false,
                '\n' => {
                    line += 1;
                    field.push('\n');
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.trim().is_empty() && !quoted_field => {
                field.clear();
                in_quotes = true;
                quoted_field = true;
                record_has_content = true;
            }
            '"' => {
                return Err((
                    line,
                    "a quote inside an unquoted field (quote the whole field and double inner quotes)".into(),
                ))
            }
            ',' => {
                fields.push(std::mem::take(&mut field));
                quoted_field = false;
                record_has_content = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => {
                if record_has_content || !field.trim().is_empty() {
                    fields.push(std::mem::take(&mut field));
                    records.push(Record { line: start_line, fields: std::mem::take(&mut fields) });
                }
                field.clear();
                quoted_field = false;
                record_has_content = false;
                line += 1;
                start_line = line;
            }
            _ => {
                if quoted_field && !c.is_whitespace() {
                    return Err((line, "text after a closing quote".into()));
                }
                field.push(c);
            }
        }
    }
    if in_quotes {
        return Err((start_line, "a quoted field is never closed".into()));
    }
    if record_has_content || !field.trim().is_empty() {
        fields.push(field);
        records.push(Record { line: start_line, fields });
    }
    Ok(records)
}

/// Parses a numeric cell: surrounding spaces allowed, must be finite.
pub fn number(cell: &str) -> Option<f32> {
    cell.trim().parse::<f32>().ok().filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn quotes_crlf_and_blank_lines() {
        let r = parse("a,\"b,c\",\"say \"\"hi\"\"\"\r\n\r\n1, 2 ,3\r\n\n\n").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].fields, vec!["a", "b,c", "say \"hi\""]);
        assert_eq!(r[1].fields, vec!["1", " 2 ", "3"]);
        assert_eq!(r[1].line, 3);
        let r = parse("\"multi\nline\",x\n1,2").unwrap();
        assert_eq!(r[0].fields[0], "multi\nline");
        assert_eq!(r[1].line, 3);
        assert!(parse("\"open,1\n2,3").is_err());
        assert!(parse("ab\"c,1").is_err());
    }
}
