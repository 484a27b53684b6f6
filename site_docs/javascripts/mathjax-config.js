// MathJax 3 settings for pymdownx.arithmatex (generic mode): it wraps inline math in \( \) and
// display math in \[ \], inside elements of class "arithmatex"; typeset only those.
// MathJax itself is served from assets/mathjax/ (copied there at build time by site_hooks/build.py).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

// The first page load is typeset by MathJax's own startup. Material's instant navigation
// (theme feature navigation.instant) is not enabled; enabling it would need a re-typeset on each
// page swap (document$.subscribe(() => MathJax.typesetPromise())).
