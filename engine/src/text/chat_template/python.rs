//! Python semantics for minijinja, so that chat templates written for jinja2
//! render the same text as under transformers.
//!
//! Chat templates on the Hub are jinja2 templates that call Python methods on
//! their values (`content.strip()`, `name.split('.')`, `message.get('x')`) and
//! rely on Python's `str()` when printing (`None`, `True`, `['a', 'b']`,
//! `{'k': 1}`, `1e-05`). minijinja prints and formats the Rust way, so this
//! module supplies:
//!
//! - [`unknown_method`]: the Python `str`/`dict`/`list` methods templates call,
//!   with Python's exact semantics where they differ from `minijinja-contrib`'s
//!   (whitespace `split`, `rsplit`, `title`, ...), falling back to it otherwise;
//!   mutating methods (`append`, `pop`, `update`) fail, as they do in jinja2's
//!   `ImmutableSandboxedEnvironment` that transformers renders with.
//! - [`python_str`]: Python's `str()` of a value, used by the output formatter
//!   and the `string` filter.
//! - [`tojson`]: transformers' own `tojson` filter, i.e. `json.dumps(x,
//!   ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! - The jinja2 tests whose Python meaning differs (`sequence`, `iterable`,
//!   `number`, `integer`, `float`).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{from_args, Kwargs, Object, ObjectRepr, Rest, ValueKind};
use minijinja::{filters, Environment, Error, ErrorKind, State, Value};
use serde_json::Value as Json;

/// jinja2's `namespace(...)`, refusing underscore-prefixed names like
/// transformers' `TemplateNamespace` does.
fn namespace(args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut init: Vec<(Value, Value)> = Vec::new();
    match args.as_slice() {
        [] => {}
        [defaults] => {
            let pairs = defaults.as_object().and_then(|o| o.try_iter_pairs()).ok_or_else(|| {
                Error::new(ErrorKind::InvalidOperation, "namespace() expects a mapping or keyword arguments")
            })?;
            init.extend(pairs);
        }
        _ => return Err(Error::new(ErrorKind::TooManyArguments, "namespace() takes at most 1 argument")),
    }
    for key in kwargs.args() {
        init.push((Value::from(key), kwargs.get::<Value>(key)?));
    }
    for (key, _) in &init {
        if key.as_str().is_some_and(|k| k.starts_with('_')) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("chat templates cannot store underscore-prefixed attributes on a namespace, but got {key}"),
            ));
        }
    }
    let defaults: Vec<(Value, Value)> = init;
    minijinja::functions::namespace(Some(Value::from_iter(defaults)))
}

/// Installs the Python behaviour into `env`: method calls, printing, the
/// filters and tests whose jinja2 meaning differs from minijinja's, and
/// `namespace` with transformers' name check.
pub(super) fn install(env: &mut Environment<'static>) {
    env.set_unknown_method_callback(unknown_method);
    env.set_formatter(|out, _state, value| out.write_str(&python_str(value)).map_err(Error::from));

    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: Value| python_str(&v));
    // jinja2's string filters convert their input with `str()` first, so a
    // list prints as `['a']`, not minijinja's `["a"]`.
    env.add_filter("trim", |v: Value, chars: Option<String>| {
        let s = python_str(&v);
        match chars {
            Some(set) => s.trim_matches(|c| set.contains(c)).to_owned(),
            None => s.trim_matches(is_py_space).to_owned(),
        }
    });
    env.add_filter("upper", |v: Value| python_str(&v).to_uppercase());
    env.add_filter("lower", |v: Value| python_str(&v).to_lowercase());
    env.add_filter("capitalize", |v: Value| py_capitalize(&python_str(&v)));
    env.add_filter("title", |v: Value| jinja_title(&python_str(&v)));
    env.add_filter("replace", |v: Value, old: String, new: String, count: Option<i64>| {
        let s = python_str(&v);
        match count.and_then(|n| usize::try_from(n).ok()) {
            Some(n) => s.replacen(&old, &new, n),
            None => s.replace(&old, &new),
        }
    });
    env.add_filter("indent", jinja_indent);
    env.add_filter("length", py_len);
    env.add_filter("count", py_len);
    // jinja2's select/reject/map family treats a falsy input (`None`) as an
    // empty sequence, unlike plain iteration; unwrap our `None` for them.
    env.add_filter("select", |state: &State, v: Value, test: Option<String>, args: Rest<Value>| {
        filters::select(state, none_to_empty(v), test.map(Cow::Owned), args)
    });
    env.add_filter("reject", |state: &State, v: Value, test: Option<String>, args: Rest<Value>| {
        filters::reject(state, none_to_empty(v), test.map(Cow::Owned), args)
    });
    env.add_filter("selectattr", |state: &State, v: Value, attr: String, test: Option<String>, args: Rest<Value>| {
        filters::selectattr(state, none_to_empty(v), Cow::Owned(attr), test.map(Cow::Owned), args)
    });
    env.add_filter("rejectattr", |state: &State, v: Value, attr: String, test: Option<String>, args: Rest<Value>| {
        filters::rejectattr(state, none_to_empty(v), Cow::Owned(attr), test.map(Cow::Owned), args)
    });
    env.add_filter("map", |state: &State, v: Value, args: Rest<Value>| filters::map(state, none_to_empty(v), args));

    env.add_test("sequence", |v: Value| is_sequence(&v));
    env.add_test("iterable", |v: Value| is_iterable(&v));
    env.add_test("number", |v: Value| is_number(&v));
    env.add_test("integer", |v: Value| v.is_integer());
    env.add_test("float", |v: Value| v.kind() == ValueKind::Number && !v.is_integer());
    env.add_test("none", |v: Value| is_none(&v));

    env.add_function("namespace", namespace);
}

/// `len()` as jinja2's `length` filter applies it: `Undefined` has length 0,
/// `None` and numbers have none.
fn py_len(v: Value) -> Result<Value, Error> {
    if v.is_undefined() {
        return Ok(Value::from(0));
    }
    if is_none(&v) {
        return Err(invalid("object of type 'NoneType' has no len()"));
    }
    match v.len() {
        Some(n) => Ok(Value::from(n)),
        None => Err(invalid(format!("object of type {} has no len()", v.kind()))),
    }
}

/// jinja2's `indent(width=4, first=False, blank=False)` filter, including
/// its quirk of appending a newline before splitting lines.
fn jinja_indent(v: Value, width: Option<Value>, first: Option<bool>, blank: Option<bool>) -> Result<String, Error> {
    let indention = match width {
        None => " ".repeat(4),
        Some(w) => match (w.as_str(), w.as_i64()) {
            (Some(s), _) => s.to_owned(),
            (None, Some(n)) => " ".repeat(n.clamp(0, 1024) as usize),
            _ => return Err(invalid("indent width must be an int or a str")),
        },
    };
    let s = python_str(&v) + "\n";
    let lines = py_splitlines(&s, false);
    let mut rv = if blank.unwrap_or(false) {
        lines.join(&format!("\n{indention}"))
    } else {
        let mut iter = lines.iter();
        let mut rv = iter.next().cloned().unwrap_or_default();
        let rest: Vec<String> =
            iter.map(|line| if line.is_empty() { String::new() } else { format!("{indention}{line}") }).collect();
        if !rest.is_empty() {
            rv.push('\n');
            rv.push_str(&rest.join("\n"));
        }
        rv
    };
    if first.unwrap_or(false) {
        rv.insert_str(0, &indention);
    }
    Ok(rv)
}

/// jinja2's `title` filter (not `str.title()`): words start after `-`,
/// whitespace or an opening bracket, and each word is capitalized.
fn jinja_title(s: &str) -> String {
    let is_sep = |c: char| c == '-' || c.is_whitespace() || matches!(c, '(' | '{' | '[' | '<');
    let mut out = String::with_capacity(s.len());
    let mut at_word_start = true;
    for c in s.chars() {
        if is_sep(c) {
            out.push(c);
            at_word_start = true;
        } else if at_word_start {
            out.extend(c.to_uppercase());
            at_word_start = false;
        } else {
            out.extend(c.to_lowercase());
        }
    }
    out
}

fn py_capitalize(s: &str) -> String {
    let mut chars = s.chars();
    let mut out = String::with_capacity(s.len());
    if let Some(first) = chars.next() {
        out.extend(first.to_uppercase());
        out.extend(chars.flat_map(char::to_lowercase));
    }
    out
}

/// Python's `None` for the `tools` and `documents` variables when the caller
/// gives none, which transformers passes as `None`.
///
/// minijinja's own `none` iterates as an empty sequence, but Python's `None`
/// is not iterable: a tool-use template that loops over `tools` when none
/// were given must fail as it does under transformers. This object is falsy,
/// prints as `None`, serializes to `null`, satisfies the `none` test and
/// refuses iteration. It is not equal to the literal `none`, so the
/// rewriter turns `tools == none` into a `none` test (see `rewrite.rs`).
/// `null`s inside JSON values stay minijinja's `none`, for which `==`
/// works.
#[derive(Debug)]
pub(super) struct PyNone;

impl Object for PyNone {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn is_true(self: &Arc<Self>) -> bool {
        false
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

/// Whether `value` is Python's `None` (minijinja's `none` or [`PyNone`]).
pub(super) fn is_none(value: &Value) -> bool {
    value.is_none() || value.downcast_object_ref::<PyNone>().is_some()
}

/// Python's `None` as minijinja's `none`, which the select/map filters treat
/// as empty (jinja2 skips falsy inputs there); other values unchanged.
pub(super) fn none_to_empty(value: Value) -> Value {
    if is_none(&value) {
        Value::from(())
    } else {
        value
    }
}

/// [`PyNone`] as a template value.
pub(super) fn absent() -> Value {
    Value::from_object(PyNone)
}

/// Converts caller JSON into template values, keeping key order.
pub(super) fn json_to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(json_to_value).collect::<Vec<_>>()),
        Json::Object(fields) => {
            Value::from_iter(fields.iter().map(|(k, v)| (Value::from(k.as_str()), json_to_value(v))))
        }
    }
}

/// Python's `str.isspace()` for one character: Unicode whitespace plus the
/// ASCII information separators (U+001C..U+001F) that Python also counts.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// Positional and keyword arguments of a Python method call, looked up by
/// position or by name, the way Python binds them.
struct PyArgs {
    positional: Vec<Value>,
    kwargs: Kwargs,
}

impl PyArgs {
    fn parse(args: &[Value]) -> Result<Self, Error> {
        let (positional, kwargs): (Rest<Value>, Kwargs) = from_args(args)?;
        Ok(Self { positional: positional.0, kwargs })
    }

    /// The argument at `idx` or named `name`; `None` (Python's) counts as absent.
    fn get(&self, idx: usize, name: &str) -> Result<Option<Value>, Error> {
        let value = match self.positional.get(idx) {
            Some(v) => Some(v.clone()),
            None => self.kwargs.get::<Option<Value>>(name)?,
        };
        Ok(value.filter(|v| !v.is_none() && !v.is_undefined()))
    }

    fn get_str(&self, idx: usize, name: &str) -> Result<Option<String>, Error> {
        match self.get(idx, name)? {
            None => Ok(None),
            Some(v) => match v.as_str() {
                Some(s) => Ok(Some(s.to_owned())),
                None => Err(invalid(format!("{name} must be str, not {}", v.kind()))),
            },
        }
    }

    fn get_int(&self, idx: usize, name: &str) -> Result<Option<i64>, Error> {
        match self.get(idx, name)? {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(n) => Ok(Some(n)),
                None => Err(invalid(format!("{name} must be an integer, not {}", v.kind()))),
            },
        }
    }

    /// Fails on arguments nobody asked for, like Python's `TypeError`.
    fn finish(&self, max_positional: usize, method: &str) -> Result<(), Error> {
        if self.positional.len() > max_positional {
            return Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("{method}() takes at most {max_positional} arguments"),
            ));
        }
        self.kwargs.assert_all_used()
    }
}

/// Resolves a method call minijinja does not know (`value.method(args)`).
///
/// Python `str`, `dict` and `list` methods are implemented here or delegated
/// to `minijinja_contrib::pycompat`; anything else is an unknown method.
pub(super) fn unknown_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if method == "__slice__" {
        return py_slice(value, args);
    }
    match value.kind() {
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            if let Some(result) = string_method(s, method, args)? {
                return Ok(result);
            }
        }
        ValueKind::Map | ValueKind::Seq => {
            if matches!(
                method,
                "append"
                    | "extend"
                    | "insert"
                    | "pop"
                    | "popitem"
                    | "remove"
                    | "clear"
                    | "update"
                    | "setdefault"
                    | "sort"
                    | "reverse"
            ) {
                // NOTE: jinja2's ImmutableSandboxedEnvironment refuses these too.
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("access to attribute '{method}' of '{}' object is unsafe", value.kind()),
                ));
            }
            if value.kind() == ValueKind::Seq && method == "index" {
                let a = PyArgs::parse(args)?;
                let needle = a.get(0, "value")?.unwrap_or_default();
                a.finish(1, method)?;
                let iter = value.try_iter()?;
                return match iter.enumerate().find(|(_, v)| *v == needle) {
                    Some((i, _)) => Ok(Value::from(i)),
                    None => Err(invalid("list.index(x): x not in list")),
                };
            }
        }
        _ => {}
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `value[start:stop:step]` with Python's semantics; the template rewriter
/// turns every slice into this call (see `rewrite.rs`).
fn py_slice(value: &Value, args: &[Value]) -> Result<Value, Error> {
    let bound = |idx: usize| -> Result<Option<i64>, Error> {
        match args.get(idx) {
            None => Ok(None),
            Some(v) if v.is_none() || v.is_undefined() || is_none(v) => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| invalid("slice indices must be integers or None")),
        }
    };
    let (start, stop, step) = (bound(0)?, bound(1)?, bound(2)?.unwrap_or(1));
    if step == 0 {
        return Err(invalid("slice step cannot be zero"));
    }
    match value.kind() {
        ValueKind::String => {
            let chars: Vec<char> = value.as_str().unwrap_or_default().chars().collect();
            let picked: String = slice_indices(chars.len(), start, stop, step).map(|i| chars[i]).collect();
            Ok(Value::from(picked))
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            let picked: Vec<Value> = slice_indices(items.len(), start, stop, step).map(|i| items[i].clone()).collect();
            Ok(Value::from(picked))
        }
        // jinja2 fails on slicing an undefined value ...
        ValueKind::Undefined => Err(Error::from(ErrorKind::UndefinedError)),
        // ... and turns a failed slice of anything else into an undefined value.
        _ => Ok(Value::UNDEFINED),
    }
}

/// The indices `range(len)[start:stop:step]` selects (CPython's
/// `PySlice_AdjustIndices`); every index is `< len`.
fn slice_indices(len: usize, start: Option<i64>, stop: Option<i64>, step: i64) -> impl Iterator<Item = usize> {
    let len = len as i64;
    let (lower, upper) = if step > 0 { (0, len) } else { (-1, len - 1) };
    let clamp = |bound: Option<i64>, default: i64| match bound {
        None => default,
        Some(b) => {
            let b = if b < 0 { b.saturating_add(len) } else { b };
            b.clamp(lower, upper)
        }
    };
    let start = clamp(start, if step > 0 { lower } else { upper });
    let stop = clamp(stop, if step > 0 { upper } else { lower });
    let mut i = start;
    std::iter::from_fn(move || {
        let in_range = if step > 0 { i < stop } else { i > stop };
        if !in_range {
            return None;
        }
        let current = i;
        i = i.saturating_add(step);
        Some(current as usize)
    })
}

/// Python `str` methods whose semantics minijinja-contrib lacks or gets
/// wrong; `Ok(None)` hands the call on to minijinja-contrib.
fn string_method(s: &str, method: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    let value = match method {
        "split" | "rsplit" => {
            let a = PyArgs::parse(args)?;
            let sep = a.get_str(0, "sep")?;
            let maxsplit = a.get_int(1, "maxsplit")?.unwrap_or(-1);
            a.finish(2, method)?;
            let parts = if method == "split" {
                py_split(s, sep.as_deref(), maxsplit)?
            } else {
                py_rsplit(s, sep.as_deref(), maxsplit)?
            };
            Value::from(parts)
        }
        "strip" | "lstrip" | "rstrip" => {
            let a = PyArgs::parse(args)?;
            let chars = a.get_str(0, "chars")?;
            a.finish(1, method)?;
            let is_stripped = |c: char| match &chars {
                Some(set) => set.contains(c),
                None => is_py_space(c),
            };
            Value::from(match method {
                "strip" => s.trim_matches(is_stripped),
                "lstrip" => s.trim_start_matches(is_stripped),
                _ => s.trim_end_matches(is_stripped),
            })
        }
        "title" => {
            PyArgs::parse(args)?.finish(0, method)?;
            Value::from(py_title(s))
        }
        "capitalize" => {
            PyArgs::parse(args)?.finish(0, method)?;
            Value::from(py_capitalize(s))
        }
        "swapcase" => {
            PyArgs::parse(args)?.finish(0, method)?;
            let mut out = String::with_capacity(s.len());
            for c in s.chars() {
                if c.is_uppercase() {
                    out.extend(c.to_lowercase());
                } else {
                    out.extend(c.to_uppercase());
                }
            }
            Value::from(out)
        }
        "isspace" => {
            PyArgs::parse(args)?.finish(0, method)?;
            Value::from(!s.is_empty() && s.chars().all(is_py_space))
        }
        "index" | "rindex" => {
            let a = PyArgs::parse(args)?;
            let sub = a.get_str(0, "sub")?.unwrap_or_default();
            a.finish(1, method)?;
            let found = if method == "index" { s.find(&sub) } else { s.rfind(&sub) };
            match found {
                Some(byte_idx) => Value::from(s[..byte_idx].chars().count()),
                None => return Err(invalid("substring not found")),
            }
        }
        "find" | "rfind" => {
            let a = PyArgs::parse(args)?;
            let sub = a.get_str(0, "sub")?.unwrap_or_default();
            a.finish(1, method)?;
            let found = if method == "find" { s.find(&sub) } else { s.rfind(&sub) };
            // Python indexes characters, not bytes.
            Value::from(found.map_or(-1, |byte_idx| s[..byte_idx].chars().count() as i64))
        }
        "partition" | "rpartition" => {
            let a = PyArgs::parse(args)?;
            let sep = a.get_str(0, "sep")?.unwrap_or_default();
            a.finish(1, method)?;
            if sep.is_empty() {
                return Err(invalid("empty separator"));
            }
            let found = if method == "partition" { s.find(&sep) } else { s.rfind(&sep) };
            let parts = match found {
                Some(i) => [&s[..i], sep.as_str(), &s[i + sep.len()..]],
                None if method == "partition" => [s, "", ""],
                None => ["", "", s],
            };
            Value::from(parts.iter().map(|p| Value::from(*p)).collect::<Vec<_>>())
        }
        "removeprefix" | "removesuffix" => {
            let a = PyArgs::parse(args)?;
            let affix = a.get_str(0, "affix")?.unwrap_or_default();
            a.finish(1, method)?;
            Value::from(if method == "removeprefix" {
                s.strip_prefix(affix.as_str()).unwrap_or(s)
            } else {
                s.strip_suffix(affix.as_str()).unwrap_or(s)
            })
        }
        "zfill" | "ljust" | "rjust" | "center" => {
            let a = PyArgs::parse(args)?;
            let width = a.get_int(0, "width")?.unwrap_or(0).max(0) as usize;
            let fill = match a.get_str(1, "fillchar")? {
                Some(f) if f.chars().count() == 1 => f.chars().next().unwrap_or(' '),
                Some(_) => return Err(invalid("the fill character must be exactly one character long")),
                None => ' ',
            };
            a.finish(if method == "zfill" { 1 } else { 2 }, method)?;
            Value::from(py_pad(s, method, width, fill))
        }
        "splitlines" => {
            let a = PyArgs::parse(args)?;
            let keepends = a.get(0, "keepends")?.is_some_and(|v| v.is_true());
            a.finish(1, method)?;
            Value::from(py_splitlines(s, keepends))
        }
        _ => return Ok(None),
    };
    Ok(Some(value))
}

/// Python's `str.split(sep, maxsplit)`.
fn py_split(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, Error> {
    let limit = usize::try_from(maxsplit).ok();
    match sep {
        Some("") => Err(invalid("empty separator")),
        Some(sep) => Ok(match limit {
            Some(n) => s.splitn(n.saturating_add(1), sep).map(str::to_owned).collect(),
            None => s.split(sep).map(str::to_owned).collect(),
        }),
        None => {
            let mut parts = Vec::new();
            let mut rest = s.trim_start_matches(is_py_space);
            while !rest.is_empty() {
                if limit.is_some_and(|n| parts.len() >= n) {
                    parts.push(rest.to_owned());
                    break;
                }
                let end = rest.find(is_py_space).unwrap_or(rest.len());
                parts.push(rest[..end].to_owned());
                rest = rest[end..].trim_start_matches(is_py_space);
            }
            Ok(parts)
        }
    }
}

/// Python's `str.rsplit(sep, maxsplit)`.
fn py_rsplit(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, Error> {
    let limit = usize::try_from(maxsplit).ok();
    let mut parts: Vec<String> = match sep {
        Some("") => return Err(invalid("empty separator")),
        Some(sep) => match limit {
            Some(n) => s.rsplitn(n.saturating_add(1), sep).map(str::to_owned).collect(),
            None => s.rsplit(sep).map(str::to_owned).collect(),
        },
        None => {
            let mut parts = Vec::new();
            let mut rest = s.trim_end_matches(is_py_space);
            while !rest.is_empty() {
                if limit.is_some_and(|n| parts.len() >= n) {
                    parts.push(rest.to_owned());
                    break;
                }
                let start = rest.rfind(is_py_space).map_or(0, |i| i + char_len_at(rest, i));
                parts.push(rest[start..].to_owned());
                rest = rest[..start].trim_end_matches(is_py_space);
            }
            parts
        }
    };
    parts.reverse();
    Ok(parts)
}

fn char_len_at(s: &str, byte_idx: usize) -> usize {
    s[byte_idx..].chars().next().map_or(1, char::len_utf8)
}

/// Python's `str.splitlines(keepends)`: splits on every Unicode line boundary
/// Python knows, `\r\n` counting as one.
fn py_splitlines(s: &str, keepends: bool) -> Vec<String> {
    let is_break = |c: char| {
        matches!(
            c,
            '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
        )
    };
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !is_break(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r' {
            if let Some(&(_, '\n')) = chars.peek() {
                chars.next();
                end += 1;
            }
        }
        lines.push(s[start..if keepends { end } else { i }].to_owned());
        start = end;
    }
    if start < s.len() {
        lines.push(s[start..].to_owned());
    }
    lines
}

/// Python's `str.title()`: a cased character after an uncased one starts a
/// word (so `"it's"` becomes `"It'S"`, exactly like Python).
fn py_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        let cased = c.is_uppercase() || c.is_lowercase();
        if prev_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        prev_cased = cased;
    }
    out
}

fn py_pad(s: &str, method: &str, width: usize, fill: char) -> String {
    let len = s.chars().count();
    if len >= width {
        return s.to_owned();
    }
    let pad = width - len;
    let repeat = |n: usize| std::iter::repeat_n(fill, n).collect::<String>();
    match method {
        "zfill" => {
            let (sign, digits) = match s.chars().next() {
                Some(c @ ('+' | '-')) => (c.to_string(), &s[1..]),
                _ => (String::new(), s),
            };
            format!("{sign}{}{digits}", "0".repeat(pad))
        }
        "ljust" => format!("{s}{}", repeat(pad)),
        "rjust" => format!("{}{s}", repeat(pad)),
        _ => {
            // CPython's centering puts the odd extra fill on the left when the width is odd.
            let left = pad / 2 + (pad & width & 1);
            format!("{}{s}{}", repeat(left), repeat(pad - left))
        }
    }
}

/// Python's `str()` of a template value, which is what jinja2 prints for
/// `{{ value }}`: `None`, `True`, `1.0`, `['a', 1]`, `{'k': 'v'}`.
pub(super) fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        _ => {
            let mut out = String::new();
            python_repr(value, &mut out);
            out
        }
    }
}

/// Python's `repr()` of a template value (strings quoted), as seen inside a
/// printed list or dict.
fn python_repr(value: &Value, out: &mut String) {
    if is_none(value) {
        out.push_str("None");
        return;
    }
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_str(value)),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    python_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map if is_plain_map(value) => {
            out.push('{');
            if let Some(pairs) = value.as_object().and_then(|o| o.try_iter_pairs()) {
                for (i, (k, v)) in pairs.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    python_repr(&k, out);
                    out.push_str(": ");
                    python_repr(&v, out);
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Whether a map value is a plain dict (not a namespace, loop or other
/// object that only looks like a map).
fn is_plain_map(value: &Value) -> bool {
    value.as_object().is_some_and(|o| matches!(o.repr(), minijinja::value::ObjectRepr::Map))
}

/// Python's `repr()` of a `str`: single quotes unless the text contains a
/// single quote and no double quote; non-printable characters escaped.
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_py_printable(c) => {
                let code = c as u32;
                let _ = if code < 0x100 {
                    write!(out, "\\x{code:02x}")
                } else if code < 0x10000 {
                    write!(out, "\\u{code:04x}")
                } else {
                    write!(out, "\\U{code:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An approximation of Python's `str.isprintable()` for one character: control
/// and format characters and separators other than the space are escaped.
fn is_py_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    let code = c as u32;
    !(c.is_control()
        || is_py_space(c)
        || code == 0xad
        || (0x200b..=0x200f).contains(&code)
        || (0x202a..=0x202e).contains(&code)
        || (0x2060..=0x2064).contains(&code)
        || code == 0xfeff
        || (0xd800..=0xdfff).contains(&code)
        || (0xe000..=0xf8ff).contains(&code))
}

/// Python's `str()` of a number: integers as is, floats as `repr(float)`.
fn number_str(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) => float_repr(f),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for
/// exponents in `-4..16` (always with a fractional part), scientific with a
/// two-digit signed exponent otherwise (`1e-05`, `1e+16`).
pub(super) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits as `d.ddde<exp>`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            let (int_part, frac_part) = if digits.len() > int_len {
                (digits[..int_len].to_owned(), digits[int_len..].to_owned())
            } else {
                (format!("{digits}{}", "0".repeat(int_len - digits.len())), "0".to_owned())
            };
            format!("{sign}{int_part}.{frac_part}")
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs())
    }
}

/// Options of Python's `json.dumps` that transformers' `tojson` exposes.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, without jinja2's HTML
/// escaping, in the argument order of that signature.
pub(super) fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let pick = |idx: usize, name: &str| -> Result<Option<Value>, Error> {
        match args.get(idx) {
            Some(v) => Ok(Some(v.clone())),
            None => kwargs.get::<Option<Value>>(name),
        }
    };
    if args.len() > 4 {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson() takes at most 4 arguments"));
    }
    let ensure_ascii = pick(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(1, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            (None, Some(s)) => Some(s.to_owned()),
            _ => return Err(invalid(format!("tojson indent must be an int or a str, not {}", v.kind()))),
        },
    };
    let (mut item_sep, mut key_sep) =
        if indent.is_some() { (",".to_owned(), ": ".to_owned()) } else { (", ".to_owned(), ": ".to_owned()) };
    if let Some(seps) = pick(2, "separators")?.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                item_sep = a.as_str().unwrap_or_default().to_owned();
                key_sep = b.as_str().unwrap_or_default().to_owned();
            }
            _ => return Err(invalid("tojson separators must be a pair of strings")),
        }
    }
    let sort_keys = pick(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

fn write_json(value: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    if is_none(value) {
        out.push_str("null");
        return Ok(());
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                out.push_str(&value.to_string());
            } else {
                let f = f64::try_from(value.clone())?;
                out.push_str(&if f.is_nan() {
                    "NaN".to_owned()
                } else if f.is_infinite() {
                    if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
                } else {
                    float_repr(f)
                });
            }
        }
        ValueKind::String => write_json_str(value.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_json_container(out, style, depth, '[', ']', items.len(), |i, out| {
                write_json(&items[i], style, depth + 1, out)
            })?;
        }
        ValueKind::Map if is_plain_map(value) => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            if let Some(iter) = value.as_object().and_then(|o| o.try_iter_pairs()) {
                for (k, v) in iter {
                    pairs.push((json_key(&k)?, v));
                }
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_json_container(out, style, depth, '{', '}', pairs.len(), |i, out| {
                write_json_str(&pairs[i].0, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                write_json(&pairs[i].1, style, depth + 1, out)
            })?;
        }
        _ => {
            return Err(invalid(format!("object of type {} is not JSON serializable", value.kind())));
        }
    }
    Ok(())
}

fn write_json_container(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for i in 0..len {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, depth + 1);
        item(i, out)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A dict key as `json.dumps` writes it: strings as is, numbers, booleans and
/// `None` converted, anything else rejected.
fn json_key(key: &Value) -> Result<String, Error> {
    if is_none(key) {
        return Ok("null".to_owned());
    }
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::Number => number_str(key),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_owned(),
        ValueKind::None => "null".to_owned(),
        kind => return Err(invalid(format!("keys must be str, int, float, bool or None, not {kind}"))),
    })
}

fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// jinja2's `sequence` test: anything with a length and item access, which in
/// Python includes strings and dicts (and jinja2's `Undefined`).
pub(super) fn is_sequence(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Undefined)
}

/// jinja2's `iterable` test: strings, lists, dicts and `Undefined` iterate;
/// `None`, numbers and booleans do not.
pub(super) fn is_iterable(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable | ValueKind::Undefined
    )
}

/// jinja2's `number` test: Python's `bool` is a subclass of `int`.
pub(super) fn is_number(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Number | ValueKind::Bool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456789.0, "123456789.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (9999999999999998.0, "9999999999999998.0"),
            (0.0, "0.0"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn split_matches_python() {
        let s = "  a b\t\n c  ";
        assert_eq!(py_split(s, None, -1).unwrap(), ["a", "b", "c"]);
        assert_eq!(py_split(s, None, 1).unwrap(), ["a", "b\t\n c  "]);
        assert_eq!(py_rsplit(s, None, 1).unwrap(), ["  a b", "c"]);
        assert_eq!(py_split("a,b,,c", Some(","), -1).unwrap(), ["a", "b", "", "c"]);
        assert_eq!(py_split("a,b,,c", Some(","), 1).unwrap(), ["a", "b,,c"]);
        assert_eq!(py_rsplit("a.b.c", Some("."), 1).unwrap(), ["a.b", "c"]);
        assert!(py_split("abc", Some(""), -1).is_err());
        assert!(py_split("", None, -1).unwrap().is_empty());
    }

    #[test]
    fn title_and_padding_match_python() {
        assert_eq!(py_title("hello world's end"), "Hello World'S End");
        assert_eq!(py_pad("-42", "zfill", 6, ' '), "-00042");
        assert_eq!(py_pad("ab", "center", 5, '*'), "**ab*");
        assert_eq!(py_pad("abc", "center", 6, '*'), "*abc**");
        assert_eq!(py_splitlines("a\r\nb\nc", false), ["a", "b", "c"]);
        assert_eq!(py_splitlines("a\r\nb\n", true), ["a\r\n", "b\n"]);
    }

    #[test]
    fn slices_match_python() {
        let idx = |len, start, stop, step| slice_indices(len, start, stop, step).collect::<Vec<_>>();
        assert_eq!(idx(0, None, None, -1), Vec::<usize>::new());
        assert_eq!(idx(3, None, None, -1), [2, 1, 0]);
        assert_eq!(idx(3, Some(2), Some(0), -1), [2, 1]);
        assert_eq!(idx(3, Some(-1), Some(-5), -1), [2, 1, 0]);
        assert_eq!(idx(5, Some(1), None, 2), [1, 3]);
        assert_eq!(idx(5, Some(-2), None, 1), [3, 4]);
        assert_eq!(idx(5, Some(0), Some(2), -1), Vec::<usize>::new());
        assert_eq!(idx(5, Some(10), Some(-10), 1), Vec::<usize>::new());
        assert_eq!(idx(3, None, Some(-1), 1), [0, 1]);
    }

    #[test]
    fn repr_matches_python() {
        let v = Value::from_serialize(serde_json::json!({"a": [1, 2.5, null, true, "it's"], "b": "x\ny"}));
        assert_eq!(python_str(&v), r#"{'a': [1, 2.5, None, True, "it's"], 'b': 'x\ny'}"#);
        assert_eq!(python_str(&Value::from(false)), "False");
        assert_eq!(python_str(&Value::from(())), "None");
    }
}
