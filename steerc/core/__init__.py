"""What every stage stands on: source text and spans, limits, paths inside the project root, the user
cache, the one JSON reader and writer, and the checker for steerc's own format schemas."""
