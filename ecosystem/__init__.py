"""The ecosystem report: diffrax, lineax and optimistix with their Modules auto-static."""
