"""The process :func:`millstream.ui.start_view` starts: ``python -m millstream.ui.child``.

A module of its own, which the package does not import, so that ``-m`` runs it fresh."""

from millstream.ui.server import serve_child

if __name__ == "__main__":
    serve_child()
