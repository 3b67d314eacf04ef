//! A layer's changes for people and machines: a summary line per path
//! (`--stat`), JSON, and a git-style unified diff that `git apply` takes
//! (binary files, special files and directories are listed as `#` lines,
//! which git skips between file patches).

use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use similar::TextDiff;

use crate::LayerError;
use crate::apply::refusal;
use crate::changes::{Change, ChangeKind, Node, NodeKind};
use crate::host::{HostTree, open_node_content, read_node_content};
use crate::store::Layer;

/// `+` and `-` line counts of a text change (none for binary ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineCounts {
    pub added: usize,
    pub removed: usize,
}

/// One line per change: a letter (A added, M modified, D deleted, R
/// renamed, T type changed, m mode changed), the path, what it is, and
/// why apply would skip it.
pub fn stat(layer: &Layer, changes: &[Change]) -> Result<String, LayerError> {
    let host = layer.host()?;
    let mut out = String::new();
    let (mut added, mut removed) = (0, 0);
    for c in shown(changes) {
        let letter = match c.kind {
            ChangeKind::Added => "A",
            ChangeKind::Modified => "M",
            ChangeKind::Deleted => "D",
            ChangeKind::Renamed => "R",
            ChangeKind::TypeChanged => "T",
            ChangeKind::ModeChanged => "m",
        };
        let mut line = format!("{letter} {}", quote(&c.path));
        if let Some(from) = &c.renamed_from {
            line = format!("{letter} {} -> {}", quote(from), quote(&c.path));
        }
        let _ = write!(line, " ({})", describe(c));
        if let Some(counts) = line_counts(layer, &host, c)? {
            added += counts.added;
            removed += counts.removed;
            let _ = write!(line, " +{} -{}", counts.added, counts.removed);
        }
        if let Some(why) = refusal(c) {
            let _ = write!(line, "  [not applied: {why}]");
        }
        let _ = writeln!(out, "{line}");
    }
    let files = shown(changes).count();
    let _ = writeln!(
        out,
        "{files} path{} changed, {added} insertion{}(+), {removed} deletion{}(-)",
        if files == 1 { "" } else { "s" },
        if added == 1 { "" } else { "s" },
        if removed == 1 { "" } else { "s" },
    );
    Ok(out)
}

/// The changes a person reads: a renamed file's source is shown by its
/// rename, not as a deletion too.
fn shown(changes: &[Change]) -> impl Iterator<Item = &Change> {
    let sources: Vec<&Path> = changes
        .iter()
        .filter_map(|c| c.renamed_from.as_deref())
        .collect();
    changes
        .iter()
        .filter(move |c| !(c.kind == ChangeKind::Deleted && sources.contains(&c.path.as_path())))
}

fn describe(c: &Change) -> String {
    let node = |n: &Node| match &n.kind {
        NodeKind::File => format!("file {:o}", n.mode),
        NodeKind::Dir => format!("directory {:o}", n.mode),
        NodeKind::Symlink { target } => format!("symlink to {}", quote(target)),
        NodeKind::Special { what } => what.to_string(),
    };
    match (&c.host, &c.layer) {
        (Some(h), Some(l)) if c.kind == ChangeKind::ModeChanged => {
            format!("mode {:o} -> {:o}", h.mode, l.mode)
        }
        (Some(h), Some(l)) if c.kind == ChangeKind::TypeChanged => {
            format!("{} -> {}", node(h), node(l))
        }
        (_, Some(l)) => node(l),
        (Some(h), None) => node(h),
        (None, None) => String::new(),
    }
}

/// Files larger than this get no line diff (listed as binary): reading
/// them whole, and diffing lines (quadratic at worst), is not bounded
/// otherwise; a sparse file may claim terabytes.
pub const TEXT_LIMIT: u64 = 4 << 20;

/// Text of a change's two sides, when both are text (or absent).
fn texts(
    layer: &Layer,
    host: &HostTree,
    c: &Change,
) -> Result<Option<(String, String)>, LayerError> {
    let side = |n: Option<&Node>, from_layer: bool| -> Result<Option<String>, LayerError> {
        let Some(n) = n else {
            return Ok(Some(String::new()));
        };
        match &n.kind {
            NodeKind::File if n.size > TEXT_LIMIT => Ok(None),
            NodeKind::File => {
                let bytes = if from_layer {
                    read_node_content(layer, n)?
                } else {
                    host.read(&c.path)?
                };
                Ok(as_text(bytes))
            }
            NodeKind::Symlink { target } => Ok(as_text(target.as_os_str().as_bytes().to_vec())),
            _ => Ok(None),
        }
    };
    let old = match c.kind {
        ChangeKind::Renamed | ChangeKind::Added => Some(String::new()),
        _ => side(c.host.as_ref(), false)?,
    };
    let new = side(c.layer.as_ref(), true)?;
    Ok(old.zip(new))
}

/// How much of a file that is not shown as text `diff` still shows, as
/// `#|` lines with every byte a person could not see escaped: one lone
/// carriage return must not hide a file's lines from its reviewer.
pub const PREVIEW_LIMIT: usize = 64 << 10;

/// The agent's side of a file not shown as text: its size, then its first
/// [`PREVIEW_LIMIT`] bytes line by line, escaped.
fn preview(layer: &Layer, node: &Node, out: &mut String) -> Result<(), LayerError> {
    use std::io::Read;
    let shown = node.source.display(layer);
    let mut head = Vec::new();
    open_node_content(layer, node)?
        .take(PREVIEW_LIMIT as u64)
        .read_to_end(&mut head)
        .map_err(|e| LayerError::io("read", &shown, e))?;
    let _ = writeln!(
        out,
        "#   {} bytes; {} shown, escaped:",
        node.size,
        if (head.len() as u64) < node.size {
            format!("the first {}", head.len())
        } else {
            "all".to_string()
        }
    );
    let body = head.strip_suffix(b"\n").unwrap_or(&head);
    for line in body.split(|b| *b == b'\n') {
        let _ = writeln!(out, "#| {}", substrat_policy::text::escape_bytes(line));
    }
    Ok(())
}

/// How long one file's line diff may search for the smallest diff: past
/// it the diff is still right, only less tight. A file rewritten whole
/// (tens of thousands of lines, every one new) makes the search quadratic;
/// an agent could make a review take hours that way.
const DIFF_DEADLINE: std::time::Duration = std::time::Duration::from_millis(200);

fn line_diff<'a>(old: &'a str, new: &'a str) -> TextDiff<'a, 'a, 'a, str> {
    TextDiff::configure()
        .timeout(DIFF_DEADLINE)
        .diff_lines(old, new)
}

/// Text is UTF-8 without NUL bytes and without a carriage return outside
/// a CRLF: a lone CR would end a line in the diff (and overwrite it on a
/// terminal), so such a file is shown as binary.
fn as_text(bytes: Vec<u8>) -> Option<String> {
    if bytes.iter().take(8000).any(|b| *b == 0) {
        return None;
    }
    let lone_cr = bytes
        .iter()
        .enumerate()
        .any(|(i, b)| *b == b'\r' && bytes.get(i + 1) != Some(&b'\n'));
    if lone_cr {
        return None;
    }
    String::from_utf8(bytes).ok()
}

fn line_counts(
    layer: &Layer,
    host: &HostTree,
    c: &Change,
) -> Result<Option<LineCounts>, LayerError> {
    let files = |n: &Option<Node>| {
        n.as_ref()
            .is_none_or(|n| matches!(n.kind, NodeKind::File | NodeKind::Symlink { .. }))
    };
    if c.kind == ChangeKind::ModeChanged || !files(&c.host) || !files(&c.layer) {
        return Ok(None);
    }
    if c.kind == ChangeKind::Renamed {
        return Ok(Some(LineCounts::default()));
    }
    Ok(texts(layer, host, c)?.map(|(old, new)| {
        let diff = line_diff(&old, &new);
        let mut counts = LineCounts::default();
        for op in diff.iter_all_changes() {
            match op.tag() {
                similar::ChangeTag::Insert => counts.added += 1,
                similar::ChangeTag::Delete => counts.removed += 1,
                similar::ChangeTag::Equal => {}
            }
        }
        counts
    }))
}

/// git's mode for a node in a patch.
fn git_mode(n: &Node) -> Option<&'static str> {
    match n.kind {
        NodeKind::File if n.mode & 0o100 != 0 => Some("100755"),
        NodeKind::File => Some("100644"),
        NodeKind::Symlink { .. } => Some("120000"),
        _ => None,
    }
}

/// The whole change set as one patch `git apply` takes.
pub fn unified(layer: &Layer, changes: &[Change]) -> Result<String, LayerError> {
    let host = layer.host()?;
    let mut out = String::new();
    for c in shown(changes) {
        if c.kind == ChangeKind::TypeChanged {
            // git shows a type change as the old path deleted, then added.
            let mut gone = c.clone();
            gone.kind = ChangeKind::Deleted;
            gone.layer = None;
            file_patch(layer, &host, &gone, &mut out)?;
            let mut made = c.clone();
            made.kind = ChangeKind::Added;
            made.host = None;
            file_patch(layer, &host, &made, &mut out)?;
        } else {
            file_patch(layer, &host, c, &mut out)?;
        }
    }
    Ok(out)
}

fn file_patch(
    layer: &Layer,
    host: &HostTree,
    c: &Change,
    out: &mut String,
) -> Result<(), LayerError> {
    let old_mode = c.host.as_ref().and_then(git_mode);
    let new_mode = c.layer.as_ref().and_then(git_mode);
    let p = quote(&c.path);
    let from = c.renamed_from.as_deref().map(quote);
    if (c.host.is_some() && old_mode.is_none()) || (c.layer.is_some() && new_mode.is_none()) {
        let _ = writeln!(
            out,
            "# {p}: {} ({}), not in this patch",
            kind_word(c),
            describe(c)
        );
        return Ok(());
    }
    // The two sides' text, read before anything is written: a binary file
    // gets no header at all (an empty "new file" would be made by git).
    let text = match c.kind {
        ChangeKind::ModeChanged | ChangeKind::Renamed => None,
        _ => match texts(layer, host, c)? {
            Some(text) => Some(text),
            None => {
                let _ = writeln!(out, "# {p}: binary, {}, not in this patch", kind_word(c));
                if let Some(node) = c.layer.as_ref().filter(|n| n.kind == NodeKind::File) {
                    preview(layer, node, out)?;
                }
                return Ok(());
            }
        },
    };
    // A mode change git cannot say (both sides 100644: 0644 -> 0600) has
    // no patch: a bare header would make `git apply` refuse the patch.
    if c.kind == ChangeKind::ModeChanged && old_mode == new_mode {
        let _ = writeln!(
            out,
            "# {p}: mode changed ({}), not in this patch",
            describe(c)
        );
        return Ok(());
    }
    let old_path = c.renamed_from.as_deref().unwrap_or(&c.path);
    let _ = writeln!(
        out,
        "diff --git {} {}",
        prefixed("a/", old_path),
        prefixed("b/", &c.path)
    );
    match (old_mode, new_mode) {
        (None, Some(m)) if c.kind != ChangeKind::Renamed => {
            let _ = writeln!(out, "new file mode {m}");
        }
        (Some(m), None) => {
            let _ = writeln!(out, "deleted file mode {m}");
        }
        (Some(o), Some(n)) if o != n => {
            let _ = writeln!(out, "old mode {o}\nnew mode {n}");
        }
        _ => {}
    }
    if let Some(from) = &from {
        let _ = writeln!(
            out,
            "similarity index 100%\nrename from {from}\nrename to {p}"
        );
        return Ok(());
    }
    let Some((old, new)) = text else {
        return Ok(());
    };
    let old_name = if c.host.is_some() {
        prefixed("a/", &c.path)
    } else {
        "/dev/null".into()
    };
    let new_name = if c.layer.is_some() {
        prefixed("b/", &c.path)
    } else {
        "/dev/null".into()
    };
    let diff = line_diff(&old, &new);
    let body = diff
        .unified_diff()
        .context_radius(3)
        .header(&old_name, &new_name)
        .to_string();
    out.push_str(&body);
    Ok(())
}

fn kind_word(c: &Change) -> &'static str {
    match c.kind {
        ChangeKind::Added => "added",
        ChangeKind::Modified => "modified",
        ChangeKind::Deleted => "deleted",
        ChangeKind::Renamed => "renamed",
        ChangeKind::TypeChanged => "type changed",
        ChangeKind::ModeChanged => "mode changed",
    }
}

/// `a/PATH` or `b/PATH` as git writes it: the prefix inside the quotes
/// (`"a/caf\303\251"`, not `a/"caf\303\251"`, which git would take as a
/// name with quotes in it).
fn prefixed(prefix: &str, path: &Path) -> String {
    quote(&Path::new(prefix).join(path))
}

/// A path as git writes one: as is when plain, else in double quotes with
/// C escapes (octal for every byte outside printable ASCII), so no byte an
/// agent chose in a name reaches a terminal raw (`text::quote_path`).
pub fn quote(path: &Path) -> String {
    substrat_policy::text::quote_path(path.as_os_str().as_bytes())
}
