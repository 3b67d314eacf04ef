"""A TCP proxy between one daemon and PostgreSQL that the nemesis can cut:
`reset` closes every connection and refuses new ones; `blackhole` keeps
them open but passes no byte (a daemon then sees only silence). `restore`
passes traffic again (connections cut stay cut)."""

import selectors
import socket
import threading

PASS, RESET, BLACKHOLE = "pass", "reset", "blackhole"


class Proxy:
    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.mode = PASS
        self._lock = threading.Lock()
        self._conns = []
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    def _accept(self):
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.mode == RESET:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            pair = (client, server)
            with self._lock:
                self._conns.append(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

    def _pump(self, pair):
        sel = selectors.DefaultSelector()
        client, server = pair
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        try:
            while not self._stopped:
                if self.mode == RESET:
                    break
                for key, _ in sel.select(timeout=0.1):
                    if self.mode != PASS:
                        # Blackhole: read nothing; TCP backs up on its own.
                        continue
                    data = key.fileobj.recv(65536)
                    if not data:
                        raise OSError("closed")
                    key.data.sendall(data)
                if self.mode == BLACKHOLE:
                    # Sleep rather than spin while bytes wait unread.
                    threading.Event().wait(0.1)
        except OSError:
            pass
        finally:
            sel.close()
            with self._lock:
                if pair in self._conns:
                    self._conns.remove(pair)
            _close(client)
            _close(server)

    def cut(self, mode):
        self.mode = mode

    def restore(self):
        # A blackholed connection is dropped on restore as well: bytes held
        # back for long would arrive out of any sensible order.
        if self.mode == BLACKHOLE:
            with self._lock:
                conns = list(self._conns)
            for c, s in conns:
                _close(c)
                _close(s)
        self.mode = PASS

    def stop(self):
        self._stopped = True
        _close(self.listener)
        with self._lock:
            conns = list(self._conns)
        for c, s in conns:
            _close(c)
            _close(s)


def _close(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
