//! Source rewrites applied before a template is compiled, for the two jinja2
//! constructs minijinja does not handle the way transformers does.
//!
//! - `{% generation %}...{% endgeneration %}` (transformers' extension that
//!   marks assistant text for training masks and renders its body unchanged)
//!   becomes an always-true `{% if true %}...{% endif %}` with the same
//!   whitespace control, since minijinja has no such tag.
//! - Slices `x[a:b:c]` become a method call `x.__slice__(a, b, c)` that
//!   [`super::python`] implements with Python's semantics: minijinja's own
//!   slicing with a negative step includes index 0 when it should stop before
//!   it, and panics on an empty sequence (`messages[::-1]` with no messages).
//!
//! The scanner knows just enough of the Jinja lexer to do this safely: it
//! only rewrites inside `{{ }}` and `{% %}`, skips comments, `{% raw %}`
//! blocks and string literals.

/// Applies both rewrites to a template source.
pub(super) fn rewrite_template(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 64);
    let mut rest = source;
    while let Some(open) = rest.find('{') {
        let after = &rest[open..];
        let kind = match after.as_bytes().get(1) {
            Some(b'{') => "}}",
            Some(b'%') => "%}",
            Some(b'#') => "#}",
            _ => {
                out.push_str(&rest[..open + 1]);
                rest = &rest[open + 1..];
                continue;
            }
        };
        out.push_str(&rest[..open]);
        let body_start = 2;
        if kind == "#}" {
            // Comments are copied verbatim; an unterminated one is left for
            // the parser to report.
            let end = after.find("#}").map_or(after.len(), |i| i + 2);
            out.push_str(&after[..end]);
            rest = &after[end..];
            continue;
        }
        let Some(body_len) = find_block_end(&after[body_start..], kind) else {
            out.push_str(after);
            rest = "";
            break;
        };
        let body = &after[body_start..body_start + body_len];
        let block_end = body_start + body_len + 2;
        if kind == "%}" {
            let (open_ctl, inner) = split_ctl_prefix(body);
            let (inner, close_ctl) = split_ctl_suffix(inner);
            match inner.trim() {
                "raw" => {
                    // Everything up to the closing `endraw` tag is literal text.
                    let raw_end = find_endraw(&after[block_end..]).map_or(after.len(), |i| block_end + i);
                    out.push_str(&after[..raw_end]);
                    rest = &after[raw_end..];
                    continue;
                }
                "generation" | "endgeneration" => {
                    let keyword = if inner.trim() == "generation" { "if true" } else { "endif" };
                    out.push_str(&format!("{{%{open_ctl} {keyword} {close_ctl}%}}"));
                    rest = &after[block_end..];
                    continue;
                }
                _ => {}
            }
        }
        out.push_str(&after[..body_start]);
        out.push_str(&rewrite_none_comparisons(&rewrite_slices(body)));
        out.push_str(kind);
        rest = &after[block_end..];
    }
    out.push_str(rest);
    out
}

/// The length of a block body up to its closing delimiter, skipping string
/// literals.
fn find_block_end(body: &str, close: &str) -> Option<usize> {
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => i = skip_string(bytes, i),
            _ if bytes[i..].starts_with(close.as_bytes()) => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The offset of the `{% endraw %}` tag (with any whitespace control).
fn find_endraw(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find("{%") {
        let start = from + i;
        let tag = &text[start + 2..];
        let end = tag.find("%}")?;
        let (_, inner) = split_ctl_prefix(&tag[..end]);
        let (inner, _) = split_ctl_suffix(inner);
        if inner.trim() == "endraw" {
            return Some(start);
        }
        from = start + 2;
    }
    None
}

/// The index just past the string literal starting at `start` (or the end
/// of input if it is unterminated).
fn skip_string(bytes: &[u8], start: usize) -> usize {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The index of the bracket closing the one at `open`, skipping strings and
/// nested brackets.
fn matching_bracket(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => {
                i = skip_string(bytes, i);
                continue;
            }
            b'[' | b'(' | b'{' => depth += 1,
            b']' | b')' | b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Splits `s` at its top-level colons (outside strings and brackets).
fn split_top_level_colons(s: &str) -> Vec<&str> {
    let bytes = s.as_bytes();
    let mut parts = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, 0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => {
                i = skip_string(bytes, i);
                continue;
            }
            b'[' | b'(' | b'{' => depth += 1,
            b']' | b')' | b'}' => depth = depth.saturating_sub(1),
            b':' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&s[start..]);
    parts
}

/// Rewrites every subscript slice in an expression into `.__slice__(...)`.
fn rewrite_slices(expr: &str) -> String {
    let bytes = expr.as_bytes();
    let mut out = String::with_capacity(expr.len());
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => i = skip_string(bytes, i),
            b'[' => {
                let Some(close) = matching_bracket(bytes, i) else {
                    break;
                };
                let inner = &expr[i + 1..close];
                let parts = split_top_level_colons(inner);
                // Only a subscript (after an operand) can be a slice; a list
                // literal with a colon is a syntax error left to the parser.
                let after_operand = expr[..i]
                    .trim_end()
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | ')' | ']' | '\'' | '"'));
                out.push_str(&expr[copied..i]);
                if after_operand && (parts.len() == 2 || parts.len() == 3) {
                    let args: Vec<String> = (0..3)
                        .map(|k| match parts.get(k).map(|p| p.trim()) {
                            Some(p) if !p.is_empty() => rewrite_slices(p),
                            _ => "none".to_owned(),
                        })
                        .collect();
                    out.push_str(&format!(".__slice__({})", args.join(", ")));
                } else {
                    out.push('[');
                    out.push_str(&rewrite_slices(inner));
                    out.push(']');
                }
                i = close + 1;
                copied = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&expr[copied..]);
    out
}

/// Turns `tools == none` / `tools != none` (also `documents`, `None`) into
/// `tools is none` / `tools is not none`: when absent these variables are a
/// Python-like `None` object that minijinja's `==` cannot equate with the
/// literal (see `python::PyNone`), while the `none` test knows it.
fn rewrite_none_comparisons(expr: &str) -> String {
    let bytes = expr.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = String::with_capacity(expr.len());
    let (mut i, mut copied) = (0, 0);
    while i < bytes.len() {
        if matches!(bytes[i], b'\'' | b'"') {
            i = skip_string(bytes, i);
            continue;
        }
        let starts_word = i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b'.');
        let name = ["tools", "documents"].into_iter().find(|n| expr[i..].starts_with(n));
        let (Some(name), true) = (name, starts_word) else {
            i += 1;
            continue;
        };
        let after_name = &expr[i + name.len()..];
        let rest = after_name.trim_start();
        let op = if rest.starts_with("==") {
            "is"
        } else if rest.starts_with("!=") {
            "is not"
        } else {
            ""
        };
        let operand = rest.get(2..).unwrap_or("").trim_start();
        let literal = ["none", "None"].into_iter().find(|l| operand.starts_with(l));
        let literal_ends = literal.is_some_and(|l| operand.as_bytes().get(l.len()).is_none_or(|&b| !is_ident(b)));
        if op.is_empty() || after_name.as_bytes().first().is_some_and(|&b| is_ident(b)) || !literal_ends {
            i += name.len();
            continue;
        }
        let literal_len = literal.map_or(0, str::len);
        let end = expr.len() - operand.len() + literal_len;
        out.push_str(&expr[copied..i]);
        out.push_str(&format!("{name} {op} none"));
        i = end;
        copied = end;
    }
    out.push_str(&expr[copied..]);
    out
}

fn split_ctl_prefix(s: &str) -> (&str, &str) {
    match s.as_bytes().first() {
        Some(b'-' | b'+') => s.split_at(1),
        _ => ("", s),
    }
}

fn split_ctl_suffix(s: &str) -> (&str, &str) {
    match s.as_bytes().last() {
        Some(b'-' | b'+') => s.split_at(s.len() - 1),
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_become_method_calls() {
        assert_eq!(rewrite_template("{{ m[::-1] }}"), "{{ m.__slice__(none, none, -1) }}");
        assert_eq!(rewrite_template("{%- for x in a[1:] -%}"), "{%- for x in a.__slice__(1, none, none) -%}");
        assert_eq!(
            rewrite_template("{{ a[b[1:]|length:] }}"),
            "{{ a.__slice__(b.__slice__(1, none, none)|length, none, none) }}"
        );
        assert_eq!(rewrite_template("{{ a[0] ~ ['x'][0] }}"), "{{ a[0] ~ ['x'][0] }}");
        assert_eq!(rewrite_template("{{ 'a[1:]' ~ x['k:v'] }}"), "{{ 'a[1:]' ~ x['k:v'] }}");
        assert_eq!(rewrite_template("{{ [{'a': 1}][0] }}"), "{{ [{'a': 1}][0] }}");
    }

    #[test]
    fn none_comparisons_of_tools_become_tests() {
        assert_eq!(rewrite_template("{% if tools != none and x %}"), "{% if tools is not none and x %}");
        assert_eq!(rewrite_template("{{ documents==None }}"), "{{ documents is none }}");
        assert_eq!(rewrite_template("{{ my_tools != none }}"), "{{ my_tools != none }}");
        assert_eq!(rewrite_template("{{ x.tools != none }}"), "{{ x.tools != none }}");
        assert_eq!(rewrite_template("{{ tools != nonex }}"), "{{ tools != nonex }}");
        assert_eq!(rewrite_template("{{ 'tools != none' }}"), "{{ 'tools != none' }}");
        assert_eq!(rewrite_template("{{ tools_x == none }}"), "{{ tools_x == none }}");
    }

    #[test]
    fn text_comments_and_raw_are_untouched() {
        let src = "text [1:] {# c[1:] #}{% raw %}{{ x[1:] }}{% endraw %}{{ y[:2] }}";
        assert_eq!(
            rewrite_template(src),
            "text [1:] {# c[1:] #}{% raw %}{{ x[1:] }}{% endraw %}{{ y.__slice__(none, 2, none) }}"
        );
    }

    #[test]
    fn generation_tags_keep_whitespace_control() {
        assert_eq!(rewrite_template("{%- generation -%}x{% endgeneration +%}"), "{%- if true -%}x{% endif +%}");
    }

    #[test]
    fn malformed_input_is_copied() {
        for src in ["{{ a[1:", "{% if x", "{#", "{{ 'abc", "{", "}}", "{{ a[1:] }"] {
            let _ = rewrite_template(src);
        }
        assert_eq!(rewrite_template("{{ a[1:"), "{{ a[1:");
    }
}
