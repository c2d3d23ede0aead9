"""Admission: token quota and budget reservations before any work is answered."""
