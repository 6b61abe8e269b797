"""Running this build's programs: a supervised child process (child), what its death means in one line
(failures), and the addresses and ports it binds (net)."""
