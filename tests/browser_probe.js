// Injected into a copy of a built page by tests/test_book.py: once the page has loaded, it
// measures what a reader at this window size sees and writes it, as JSON, into
// a pre element of id attnlab-probe, which chromium's --dump-dom then prints.
window.addEventListener("load", function () {
  var article = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
  var clipped = [], wideTables = [];
  article.querySelectorAll("*").forEach(function (el) {
    var style = getComputedStyle(el);
    // a block that scrolls sideways (the theme's wrappers of tables, code and outputs), or a
    // preformatted block whose lines run past its edge
    var scrolls = ["auto", "scroll"].indexOf(style.overflowX) >= 0 || el.tagName === "PRE";
    if (scrolls && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
      var what = el.tagName.toLowerCase() + "." + el.className + ": " + (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 80);
      // a table wider than the column, in the theme's wrapper that scrolls it sideways: its words
      // stay whole (checked below), and the reader scrolls the table, not the page
      var table = el.tagName !== "PRE" && el.children.length === 1 && el.children[0].tagName === "TABLE";
      (table ? wideTables : clipped).push(what + " (" + el.scrollWidth + " px in " + el.clientWidth + ")");
    }
  });
  var images = Array.prototype.map.call(article.querySelectorAll("img"), function (img) {
    return {src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0};
  });
  // Table cells whose text the browser broke inside a word ("shor|t nam|e", "sm_|89"): a word is
  // a run of text between whitespace (and after a hyphen, dash or slash, where a break is a
  // reader's own convention); its boxes lying on more than one line is a broken word.
  var brokenWords = [];
  article.querySelectorAll("td, th").forEach(function (cell) {
    var walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    var broken = [];
    for (var node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.parentElement && node.parentElement.closest("mjx-container, script, style")) continue;
      var re = /[^\s\-\/\u2013\u2014]+[\-\/\u2013\u2014]*/g, m;
      while ((m = re.exec(node.data)) !== null) {
        var range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        var tops = Array.prototype.filter.call(range.getClientRects(), function (r) { return r.width > 0; })
          .map(function (r) { return r.top; });
        if (tops.length && Math.max.apply(null, tops) - Math.min.apply(null, tops) > 4) broken.push(m[0]);
      }
    }
    if (broken.length) {
      var table = cell.closest("table");
      var where = table ? ((table.querySelector("th") || {}).textContent || "").trim().slice(0, 30) : "";
      brokenWords.push({cell: (cell.textContent || "").trim().slice(0, 80), words: broken, table: where});
    }
  });
  // Tables a reader sees without opening anything (not inside a closed dropdown), by body rows.
  var tables = Array.prototype.filter.call(article.querySelectorAll("table"), function (t) {
    return t.checkVisibility ? t.checkVisibility() : t.getClientRects().length > 0;
  }).map(function (t) {
    return {rows: t.querySelectorAll("tbody tr").length,
            head: ((t.querySelector("th") || {}).textContent || "").trim().slice(0, 40)};
  });
  var question = document.querySelector("div.admonition.question");
  var probe = {
    page_wider_than_window: document.documentElement.scrollWidth > window.innerWidth + 1,
    clipped: clipped,
    wide_tables: wideTables,
    broken_words: brokenWords,
    images: images,
    height: document.documentElement.scrollHeight,
    tables: tables,
    text: article.innerText,
    question: question ? {text: question.innerText, top: question.getBoundingClientRect().top + window.scrollY} : null
  };
  var out = document.createElement("pre");
  out.id = "attnlab-probe";
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
