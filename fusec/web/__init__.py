"""The web runtime that ``Exported.save(dir, target="web")`` copies next to an export:
model.js (an ES module), model.d.ts (its types) and index.html (a demo page)."""
