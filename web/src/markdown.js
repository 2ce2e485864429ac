// Markdown -> sanitized HTML: marked parses, highlight.js colours fenced code,
// DOMPurify removes anything active (scripts, handlers, javascript: URLs).
import { Marked } from 'marked';
import DOMPurify from 'dompurify';
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import cpp from 'highlight.js/lib/languages/cpp';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import python from 'highlight.js/lib/languages/python';

for (const [n, l] of Object.entries({ bash, cpp, javascript, json, python })) hljs.registerLanguage(n, l);

const marked = new Marked({ gfm: true, breaks: true });
marked.use({
  renderer: {
    code({ text, lang }) {
      const l = (lang || '').trim().split(/\s+/)[0];
      const html = l && hljs.getLanguage(l)
        ? hljs.highlight(text, { language: l }).value
        : hljs.highlightAuto(text).value;
      return `<pre><code class="hljs">${html}</code></pre>`;
    },
  },
});

export function renderMarkdown(src) {
  return DOMPurify.sanitize(marked.parse(src || ''), { USE_PROFILES: { html: true } });
}
