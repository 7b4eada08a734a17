"""Extracts a plain-text training corpus from the Rust documentation that rustup installs.

Sources (both MIT OR Apache-2.0, Copyright The Rust Project Developers; see NOTICE.txt):
  - The Rust Programming Language (the book):  <sysroot>/share/doc/rust/html/book/*.html
  - Rust by Example:                          <sysroot>/share/doc/rust/html/rust-by-example/**/*.html

From each page it keeps the text of the <main> element (prose and code blocks, in reading
order), drops navigation, scripts and the search index, and collapses runs of blank lines.
Pages are ordered by path. Output, gzip-compressed beside this script:
  train.txt.gz    every page except the held-out ones
  heldout.txt.gz  the book's chapters 20 and 21 and Rust by Example's `std_misc` section,
                  kept out of training so the held-out loss measures generalisation

Run by hand (needs only Python 3 and `rustc` on PATH):
    python3 native/examples/data/corpus/extract_rust_docs.py
"""
import gzip
import html.parser
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP_TAGS = {"script", "style", "nav", "noscript", "template"}


class MainText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth_main = 0
        self.skip = 0
        self.parts = []
        self.in_pre = 0

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.depth_main += 1
        if self.depth_main and tag in SKIP_TAGS:
            self.skip += 1
        if tag == "pre":
            self.in_pre += 1
        if self.depth_main and not self.skip and tag in ("p", "h1", "h2", "h3", "h4", "li", "pre", "br", "tr", "blockquote"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if self.depth_main and tag in SKIP_TAGS and self.skip:
            self.skip -= 1
        if tag == "pre" and self.in_pre:
            self.in_pre -= 1
        if self.depth_main and not self.skip and tag in ("p", "h1", "h2", "h3", "h4", "pre", "ul", "ol", "table"):
            self.parts.append("\n")
        if tag == "main" and self.depth_main:
            self.depth_main -= 1

    def handle_data(self, data):
        if self.depth_main and not self.skip:
            self.parts.append(data if self.in_pre else re.sub(r"\s+", " ", data))


def page_text(path):
    p = MainText()
    with open(path, encoding="utf-8", errors="replace") as f:
        p.feed(f.read())
    text = "".join(p.parts)
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def pages(root):
    out = []
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".html") and f not in ("print.html", "toc.html", "404.html", "index.html"):
                out.append(os.path.join(d, f))
    return sorted(out)


def main():
    sysroot = subprocess.check_output(["rustc", "--print", "sysroot"], text=True).strip()
    html_root = os.path.join(sysroot, "share", "doc", "rust", "html")
    book = [p for p in pages(os.path.join(html_root, "book")) if os.path.dirname(p).endswith("book")]
    rbe_root = os.path.join(html_root, "rust-by-example")
    # Rust by Example also ships translations (ja/, ko/, es/, zh/, ...): English only.
    rbe = [p for p in pages(rbe_root) if not re.fullmatch(r"[a-z]{2}(-[A-Za-z]+)?", os.path.relpath(p, rbe_root).split(os.sep)[0])]
    train, held = [], []
    for p in book + rbe:
        name = os.path.relpath(p, html_root)
        text = page_text(p)
        if len(text) < 200:
            continue
        is_held = re.search(r"book/ch2[01]-", name) or "rust-by-example/std_misc" in name
        (held if is_held else train).append(text)
    for name, texts in (("train.txt.gz", train), ("heldout.txt.gz", held)):
        data = "\n".join(texts).encode("utf-8")
        with gzip.GzipFile(os.path.join(HERE, name), "wb", mtime=0) as f:
            f.write(data)
        print(f"{name}: {len(texts)} pages, {len(data):,} bytes of text")


if __name__ == "__main__":
    main()
