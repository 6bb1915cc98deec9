// Injected into a copy of a built page by tests/test_book.py: once the page has loaded, it
// measures what a reader at this window size sees and writes it, as JSON, into
// a pre element of id attnlab-probe, which chromium's --dump-dom then prints.
window.addEventListener("load", function () {
  var article = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
  var clipped = [];
  article.querySelectorAll("*").forEach(function (el) {
    var style = getComputedStyle(el);
    // a block that scrolls sideways (the theme's wrappers of tables, code and outputs), or a
    // preformatted block whose lines run past its edge
    var scrolls = ["auto", "scroll"].indexOf(style.overflowX) >= 0 || el.tagName === "PRE";
    if (scrolls && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
      clipped.push(el.tagName.toLowerCase() + "." + el.className + ": " + (el.textContent || "").trim().slice(0, 80));
    }
  });
  var images = Array.prototype.map.call(article.querySelectorAll("img"), function (img) {
    return {src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0};
  });
  var question = document.querySelector("div.admonition.question");
  var probe = {
    page_wider_than_window: document.documentElement.scrollWidth > window.innerWidth + 1,
    clipped: clipped,
    images: images,
    text: article.innerText,
    question: question ? {text: question.innerText, top: question.getBoundingClientRect().top + window.scrollY} : null
  };
  var out = document.createElement("pre");
  out.id = "attnlab-probe";
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
