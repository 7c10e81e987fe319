"""Database errors callers outside `machine/db/` catch, under names of the store's own."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

#: A commit broke a constraint, e.g. inserted a row whose unique column already holds the
#: value: `SqlStore.commit` lets the driver's error through, and a caller racing for a
#: unique value (an incarnation number) catches it by this name. It is SQLAlchemy's
#: IntegrityError itself, so what is caught is exactly what was.
ConstraintViolation = IntegrityError
