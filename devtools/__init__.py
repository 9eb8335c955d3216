"""Tools for developing with millstream on one machine: the local stacks (:mod:`.local`) and
the proving ground that crashes every role of a topology on them (:mod:`.proving`)."""
