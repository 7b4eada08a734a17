//! The book's pages against the chapters' programs: every Rust listing a reader sees must be
//! an include of a program that `cargo test` runs, so a listing cannot drift from working
//! code. mdBook only warns about an include it cannot resolve, so this test is what fails.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The pages SUMMARY.md links, in order.
fn pages() -> Vec<String> {
    let summary = read(&root().join("book/SUMMARY.md"));
    let mut pages = Vec::new();
    for line in summary.lines() {
        if let (Some(open), Some(close)) = (line.find("]("), line.rfind(')')) {
            pages.push(line[open + 2..close].to_string());
        }
    }
    pages
}

/// Every fenced block of a page: (its info string, its lines).
fn blocks(page: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in page.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            match current.take() {
                None => current = Some((info.trim().to_string(), Vec::new())),
                Some(block) => out.push(block),
            }
        } else if let Some((_, lines)) = current.as_mut() {
            lines.push(line.to_string());
        }
    }
    assert!(current.is_none(), "a fenced block is never closed");
    out
}

/// `{{#include ../src/file.rs:anchor}}` → (file, anchor).
fn include(line: &str) -> Option<(String, Option<String>)> {
    let inner = line.trim().strip_prefix("{{#include ")?.strip_suffix("}}")?;
    let (file, anchor) = match inner.split_once(':') {
        Some((f, a)) => (f, Some(a.to_string())),
        None => (inner, None),
    };
    Some((file.to_string(), anchor))
}

/// The line range inside `// ANCHOR: name` … `// ANCHOR_END: name`.
fn anchor_range(source: &str, name: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines.iter().position(|l| l.trim() == format!("// ANCHOR: {name}"))?;
    let end = lines.iter().position(|l| l.trim() == format!("// ANCHOR_END: {name}"))?;
    (start < end).then_some((start, end))
}

#[test]
fn every_rust_listing_is_an_include_of_a_tested_program() {
    let pages = pages();
    assert_eq!(pages.len(), 17, "the introduction and sixteen chapters: {pages:?}");
    let mut programs_shown = BTreeSet::new();
    for page_name in &pages {
        let path = root().join("book").join(page_name);
        let page = read(&path);
        assert!(!page.contains("PLACEHOLDER"), "{page_name} is not written");
        let mut includes = 0;
        for (info, lines) in blocks(&page) {
            if !info.starts_with("rust") {
                continue;
            }
            for line in lines.iter().filter(|l| !l.trim().is_empty()) {
                let (file, anchor) = include(line)
                    .unwrap_or_else(|| panic!("{page_name}: a Rust listing typed into the page: {line:?}"));
                let source_path = path.parent().map(|p| p.join(&file)).unwrap_or_default();
                let source = read(&source_path);
                if let Some(anchor) = &anchor {
                    assert!(
                        anchor_range(&source, anchor).is_some(),
                        "{page_name}: {file} has no anchor {anchor:?}"
                    );
                }
                programs_shown.insert((file, anchor));
                includes += 1;
            }
        }
        if page_name != "introduction.md" {
            assert!(includes > 0, "{page_name} shows no program");
        }
    }

    // Each chapter's program is shown, its `main` included.
    let mut chapters: Vec<PathBuf> = fs::read_dir(root().join("src"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    chapters.retain(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ch")));
    chapters.sort();
    assert_eq!(chapters.len(), 16);
    for chapter in chapters {
        let name = chapter.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let source = read(&chapter);
        assert!(!source.contains("PLACEHOLDER"), "{name} is not written");
        let main = source
            .lines()
            .position(|l| l.starts_with("pub fn main()"))
            .unwrap_or_else(|| panic!("{name} has no `pub fn main()`"));
        let shown = programs_shown.iter().any(|(file, anchor)| {
            file == &format!("../src/{name}")
                && match anchor {
                    None => true,
                    Some(a) => anchor_range(&source, a).is_some_and(|(s, e)| s < main && main < e),
                }
        });
        assert!(shown, "no page includes {name}'s main");
        // Every anchor opened is closed, so no include silently shows the rest of a file.
        for line in source.lines() {
            if let Some(a) = line.trim().strip_prefix("// ANCHOR: ") {
                assert!(anchor_range(&source, a).is_some(), "{name}: anchor {a} is not closed");
            }
        }
    }
}
