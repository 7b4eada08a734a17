// The tutorials as a reader meets them: the book mdBook renders (tests/browser/run.sh runs
// `mdbook build tutorials` first) opened in headless Chromium. Every chapter page has its
// listings filled in from the chapters' programs (no unresolved include), highlighted as
// Rust, and the sidebar lists all sixteen chapters. Screenshots of three chapters go to
// tests/browser/out/book-*.png.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';
import { out, repo, chromiumPath, skip as noBrowser, base } from './common.mjs';

const book = join(repo, 'tutorials', 'target', 'book');
const noBook = existsSync(join(book, 'index.html')) ? false
  : `${book} is not built (cargo install mdbook --version 0.4.52 --locked --no-default-features; mdbook build tutorials)`;
if (noBook && process.env.RB_REQUIRE_BOOK === '1') throw new Error(`RB_REQUIRE_BOOK=1 but ${noBook}`);
const skip = noBrowser || noBook;

/** The chapter pages and their titles, from SUMMARY.md. */
function chapters() {
  const summary = readFileSync(join(repo, 'tutorials', 'book', 'SUMMARY.md'), 'utf8');
  return [...summary.matchAll(/^- \[(.+)\]\((ch\d\d-[a-z0-9-]+)\.md\)$/gm)].map((m) => ({ title: m[1], page: m[2] }));
}

test('every chapter of the rendered book shows its programs', { skip }, async () => {
  const pages = chapters();
  assert.equal(pages.length, 16, 'SUMMARY.md lists sixteen chapters');
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: base });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    for (const [i, { title, page: name }] of pages.entries()) {
      await page.goto(pathToFileURL(join(book, `${name}.html`)).href);
      const seen = await page.evaluate(() => ({
        h1: document.querySelector('main h1')?.textContent ?? '',
        rust: [...document.querySelectorAll('main pre code.language-rust')].map((c) => c.textContent),
        highlighted: document.querySelectorAll('main pre code.language-rust.hljs').length,
        text: document.querySelector('main')?.textContent ?? '',
        sidebar: document.querySelectorAll('#sidebar a[href^="ch"], .sidebar a[href^="ch"]').length,
      }));
      assert.equal(seen.h1.trim(), title, `${name}: the heading`);
      assert.ok(seen.rust.length > 0, `${name}: no Rust listing`);
      assert.equal(seen.highlighted, seen.rust.length, `${name}: a listing is not highlighted`);
      assert.ok(!seen.text.includes('{{#include'), `${name}: an include was not resolved`);
      assert.ok(seen.rust.some((code) => /\bfn main\(\)/.test(code)), `${name}: the program's main is not shown`);
      assert.ok(seen.sidebar >= 16, `${name}: the sidebar lists ${seen.sidebar} chapters`);
      if ([0, 4, 11].includes(i)) {
        await page.screenshot({ path: join(out, `book-${name}.png`) });
      }
    }
    assert.deepEqual(errors, [], 'script errors on the book pages');
  } finally {
    await browser.close();
  }
});
